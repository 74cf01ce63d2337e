"""Attention through cuDNN's fused flash kernel, held to our contract.

``jax.nn.dot_product_attention(implementation="cudnn")`` runs on NVIDIA GPUs for float16 and
bfloat16 inputs with one batch axis, value.shape == key.shape, head dims that are multiples of 8 up
to 128, and a bias (a boolean mask becomes one) that spans the full query and key lengths. Its
backward pass also needs even query and key lengths: jax's front end hands the backward a
placeholder bias when there is none, so its rule for trained biases ("even lengths") applies to
every gradient (found on an H100, jax 0.11.2; a classifier's CLS token makes T odd).

This wrapper pads an odd length by one (an extra query row, dropped from the output, and an extra
key that nothing attends to), broadcasts mask and bias to full length and hands them to
``xla.xla_attention``, which returns zeros on a row with nothing to attend to (cuDNN, like
jax.nn's XLA path, averages the values there), for ``empty_rows`` to decide.
"""

from __future__ import annotations

import jax.numpy as jnp

from attention_jax import xla

MAX_HEAD_DIM = 128  # 256 from Hopper on; 128 holds on every GPU cuDNN's flash kernel supports

# The jax.nn implementation this module drives. Only the tests change it, to "xla", to check on a
# CPU that the inputs prepared for cuDNN give the contract's answers.
KERNEL = "cudnn"


def check(query, key, value, request) -> str | None:
  """Why cuDNN flash attention cannot serve these shapes and dtypes, or None (what else it
  serves: attention.KERNELS; cudnn_attention brings any mask, bias and length into its form)."""
  del request
  if query.dtype not in (jnp.float16, jnp.bfloat16):
    return f"cuDNN flash attention needs float16 or bfloat16 inputs, got {query.dtype}"
  if value.shape != key.shape:
    return "cuDNN flash attention needs value.shape == key.shape"
  head_dim = query.shape[-1]
  if head_dim % 8 or head_dim > MAX_HEAD_DIM:
    return f"cuDNN flash attention needs head_dim a multiple of 8 up to {MAX_HEAD_DIM}, got {head_dim}"
  return None


def cudnn_attention(query, key, value, bias=None, mask=None, *, scale: float,
                    is_causal: bool = False, return_residual: bool = False):
  """cuDNN flash attention: query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H]
  (and the log-sum-exp [..., T, N] with ``return_residual``).

  Inputs are assumed validated and servable (attention.KERNELS).
  """
  q_len, kv_len = query.shape[-3], key.shape[-3]
  pad_q, pad_k = q_len % 2, kv_len % 2  # to even lengths, for the kernel's backward pass
  if pad_k and mask is None:
    mask = jnp.ones((1, 1), jnp.bool_)  # so that the extra key can be masked out

  def even_length(x, pad):  # [..., L, N, H] -> [..., L + pad, N, H]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(0, pad), (0, 0), (0, 0)])

  def full_length(x, dtype):  # [..., T' or 1, S' or 1] -> [..., T + pad_q, S + pad_k] in dtype
    if x is None:
      return None
    x = jnp.broadcast_to(x, x.shape[:-2] + (q_len, kv_len)).astype(dtype)
    return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad_q), (0, pad_k)])  # bias 0, mask False

  output = xla.xla_attention(even_length(query, pad_q), even_length(key, pad_k),
                             even_length(value, pad_k),
                             full_length(bias, query.dtype), full_length(mask, jnp.bool_),
                             scale=scale, is_causal=is_causal, implementation=KERNEL,
                             return_residual=return_residual)
  if return_residual:
    return output[0][..., :q_len, :, :], output[1][..., :q_len, :]
  return output[..., :q_len, :, :]
