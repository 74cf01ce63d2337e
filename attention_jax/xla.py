"""Attention through ``jax.nn.dot_product_attention(implementation="xla")``, held to our contract.

jax.nn takes exactly one batch dim and 4-d masks, turns a fully masked row into a uniform average of
the values and a row of -inf biases into NaN. This wrapper flattens the batch dims, folds -inf
biases into the mask and returns zeros for rows with nothing to attend to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_jax import masks as masks_lib


def check(query, key, value, request) -> str | None:
  """Why jax.nn cannot serve these shapes on ``request.backend``, or None (what else it serves:
  attention.KERNELS)."""
  if value.shape != key.shape:
    return "jax.nn.dot_product_attention needs value.shape == key.shape"
  if request.backend == "cpu" and query.dtype == jnp.float16:
    return ("jax.nn.dot_product_attention cannot run float16 on the CPU backend (XLA:CPU has no "
            "float16 x float16 = float32 product); cast to float32 or bfloat16")
  return None


def xla_attention(query, key, value, bias=None, mask=None, *, scale: float,
                  is_causal: bool = False, return_residual: bool = False,
                  implementation: str = "xla"):
  """jax.nn.dot_product_attention with any leading batch dims and zeros for empty rows.

  query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H] (and with ``return_residual``
  the log-sum-exp [..., T, N], float32, -inf on empty rows). ``implementation`` is passed on to
  jax.nn (the cuDNN wrapper passes "cudnn"). Inputs are assumed validated.
  """
  batch_shape = query.shape[:-3]
  bias, mask = masks_lib.fold_infinite_bias(bias, mask)
  flat = lambda x: jnp.reshape(x, (-1,) + x.shape[-3:])  # [..., L, N, H] -> [B, L, N, H]
  output = jax.nn.dot_product_attention(
      flat(query), flat(key), flat(value),
      bias=masks_lib.flatten_batch(bias, batch_shape),
      mask=masks_lib.flatten_batch(mask, batch_shape),
      scale=scale, is_causal=is_causal, implementation=implementation,
      return_residual=return_residual)
  output, residual = output if return_residual else (output, None)
  output = masks_lib.zero_empty_rows(jnp.reshape(output, query.shape), mask, key.shape[-3],
                                     is_causal=is_causal)
  if not return_residual:
    return output
  residual = jnp.reshape(residual.astype(jnp.float32), query.shape[:-1])  # [..., T, N]
  has_key = masks_lib.rows_with_keys(mask, query.shape[-3], key.shape[-3], is_causal=is_causal)
  return output, residual if has_key is None else jnp.where(has_key, residual, -jnp.inf)
