"""Attention through ``jax.nn.dot_product_attention(implementation="xla")``, held to our contract.

jax.nn takes exactly one batch dim and 4-d masks, turns a fully masked row into a uniform average of
the values and a row of -inf biases into NaN. This wrapper flattens the batch dims, folds -inf
biases into the mask and returns zeros for rows with nothing to attend to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_jax import masks as masks_lib


def unsupported_reason(query, key, value, *, dropout_rate: float, return_weights: bool,
                       has_bias_or_mask: bool) -> str | None:
  """Why jax.nn cannot serve this request, or None if it can."""
  del has_bias_or_mask  # jax.nn takes any mask and bias
  if dropout_rate > 0.0:
    return "jax.nn.dot_product_attention has no attention dropout"
  if return_weights:
    return "jax.nn.dot_product_attention does not return the attention weights"
  if value.shape != key.shape:
    return "jax.nn.dot_product_attention needs value.shape == key.shape"
  return None


def xla_attention(query, key, value, bias=None, mask=None, *, scale: float,
                  is_causal: bool = False, implementation: str = "xla"):
  """jax.nn.dot_product_attention with any leading batch dims and zeros for empty rows.

  query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H]. ``implementation`` is passed
  on to jax.nn (the cuDNN wrapper passes "cudnn"). Inputs are assumed validated.
  """
  batch_shape = query.shape[:-3]
  bias, mask = masks_lib.fold_infinite_bias(bias, mask)
  flat = lambda x: jnp.reshape(x, (-1,) + x.shape[-3:])  # [..., L, N, H] -> [B, L, N, H]
  output = jax.nn.dot_product_attention(
      flat(query), flat(key), flat(value),
      bias=masks_lib.flatten_batch(bias, batch_shape),
      mask=masks_lib.flatten_batch(mask, batch_shape),
      scale=scale, is_causal=is_causal, implementation=implementation)
  output = jnp.reshape(output, query.shape)
  return masks_lib.zero_empty_rows(output, mask, key.shape[-3], is_causal=is_causal)
