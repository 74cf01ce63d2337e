"""Attention through cuDNN's fused flash kernel, held to our contract.

``jax.nn.dot_product_attention(implementation="cudnn")`` runs on NVIDIA GPUs for float16 and
bfloat16 inputs with one batch axis, value.shape == key.shape, head dims that are multiples of 8 up
to 128, and a bias (a boolean mask becomes one) that spans the full query and key lengths, which
must be even when a bias is trained through. This wrapper broadcasts mask and bias to full
length and hands them to ``xla.xla_attention``, which flattens the batch dims, folds -inf biases
into the mask and zeros the rows with nothing to attend to (cuDNN averages their values).
"""

from __future__ import annotations

import jax.numpy as jnp

from attention_jax import xla

MAX_HEAD_DIM = 128  # 256 from Hopper on; 128 holds on every GPU cuDNN's flash kernel supports

# The jax.nn implementation this module drives. Only the tests change it, to "xla", to check on a
# CPU that the inputs prepared for cuDNN give the contract's answers.
KERNEL = "cudnn"


def unsupported_reason(query, key, value, *, dropout_rate: float, return_weights: bool,
                       has_bias_or_mask: bool) -> str | None:
  """Why cuDNN flash attention cannot serve this request, or None if it can."""
  if dropout_rate > 0.0:
    return "cuDNN attention through jax.nn has no attention dropout"
  if return_weights:
    return "cuDNN flash attention never forms the weights, so it cannot return them"
  if query.dtype not in (jnp.float16, jnp.bfloat16):
    return f"cuDNN flash attention needs float16 or bfloat16 inputs, got {query.dtype}"
  if value.shape != key.shape:
    return "cuDNN flash attention needs value.shape == key.shape"
  head_dim = query.shape[-1]
  if head_dim % 8 or head_dim > MAX_HEAD_DIM:
    return f"cuDNN flash attention needs head_dim a multiple of 8 up to {MAX_HEAD_DIM}, got {head_dim}"
  q_len, kv_len = query.shape[-3], key.shape[-3]
  if has_bias_or_mask and (q_len % 2 or kv_len % 2):
    return f"cuDNN flash attention with a mask or bias needs even lengths, got T={q_len}, S={kv_len}"
  return None


def cudnn_attention(query, key, value, bias=None, mask=None, *, scale: float,
                    is_causal: bool = False):
  """cuDNN flash attention: query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H].

  Inputs are assumed validated and servable (see ``unsupported_reason``).
  """
  q_len, kv_len = query.shape[-3], key.shape[-3]

  def full_length(x, dtype):  # [..., T' or 1, S' or 1] -> [..., T, S] in dtype
    return None if x is None else jnp.broadcast_to(x, x.shape[:-2] + (q_len, kv_len)).astype(dtype)

  return xla.xla_attention(query, key, value, full_length(bias, query.dtype),
                           full_length(mask, jnp.bool_), scale=scale, is_causal=is_causal,
                           implementation=KERNEL)
