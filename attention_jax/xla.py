"""Attention through ``jax.nn.dot_product_attention(implementation="xla")``, held to our contract.

jax.nn takes exactly one batch dim and 4-d masks, turns a fully masked row into a uniform average of
the values and a row of -inf biases into NaN. This wrapper flattens the batch dims, folds -inf
biases into the mask and returns zeros for rows with nothing to attend to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_jax import masks as masks_lib


def unsupported_reason(query, key, value, *, dropout_rate: float,
                       return_weights: bool) -> str | None:
  """Why jax.nn cannot serve this request, or None if it can."""
  if dropout_rate > 0.0:
    return "jax.nn.dot_product_attention has no attention dropout"
  if return_weights:
    return "jax.nn.dot_product_attention does not return the attention weights"
  if value.shape != key.shape:
    return "jax.nn.dot_product_attention needs value.shape == key.shape"
  return None


def xla_attention(query, key, value, bias=None, mask=None, *, scale: float,
                  is_causal: bool = False):
  """jax.nn.dot_product_attention with any leading batch dims and zeros for empty rows.

  query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H]. Inputs are assumed validated.
  """
  batch_shape, q_len, kv_len = query.shape[:-3], query.shape[-3], key.shape[-3]
  if bias is not None:  # a -inf bias means "do not attend": move it into the mask.
    attendable = bias > -jnp.inf
    mask = masks_lib.combine_masks(mask, attendable)
    bias = jnp.where(attendable, bias, 0.0)

  flat = lambda x: jnp.reshape(x, (-1,) + x.shape[-3:])  # [..., L, N, H] -> [B, L, N, H]
  output = jax.nn.dot_product_attention(
      flat(query), flat(key), flat(value),
      bias=masks_lib.flatten_batch(bias, batch_shape),
      mask=masks_lib.flatten_batch(mask, batch_shape),
      scale=scale, is_causal=is_causal, implementation="xla")
  output = jnp.reshape(output, query.shape)

  if mask is None:  # causal alone never empties a row.
    return output
  if is_causal:
    mask = masks_lib.combine_masks(mask, masks_lib.causal_mask(q_len, kv_len))
  mask = jnp.reshape(mask, (1,) * (3 - mask.ndim) + mask.shape)  # at least [N', T', S']
  row_has_key = jnp.any(mask, axis=-1)  # [..., N or 1, T or 1]
  row_has_key = jnp.swapaxes(row_has_key, -1, -2)[..., None]  # [..., T or 1, N or 1, 1]
  return jnp.where(row_has_key, output, jnp.zeros((), output.dtype))
