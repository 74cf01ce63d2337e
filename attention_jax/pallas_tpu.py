"""Attention through the Pallas flash-attention kernel for TPU, held to our contract.

``jax.experimental.pallas.ops.tpu.flash_attention`` wants head-major [B, N, L, H] with one batch
axis, as many key/value heads as query heads, lengths that are multiples of its 128-wide blocks,
an additive bias of exactly [B, N, T, S] that it adds *before* its scale, and segment ids for
padding. This wrapper feeds it the query already multiplied by the scale, a key-padding mask as
segment ids, any other mask as a large negative bias, and zeros the rows with nothing to attend to
(the kernel averages their values). Off TPU the kernel runs only in Pallas' interpret mode
(``jax.experimental.pallas.tpu.force_tpu_interpret_mode()``), which is how the tests run it.
"""

from __future__ import annotations

import jax.numpy as jnp

from attention_jax import masks as masks_lib
from attention_jax import reference

LANES = 128  # the kernel's block width: query and key lengths must be multiples of it

# Finite stand-in for -inf on masked logits. The kernel adds its own -0.7 * float32 max for causal
# and segment masking, so ours must leave room for that sum to stay finite.
_MASKED = -1e30


# jax issue 18595: the kernel fails to compile on these generations, which Colab has served.
FAILING_GENERATIONS = ("TPU v2", "TPU v3")


def check(query, key, value, request) -> str | None:
  """Why the Pallas TPU kernel cannot serve these shapes on ``request.device_kind``, or None
  (what else it serves: attention.KERNELS; any mask or bias, as segment ids or the bias)."""
  kind = request.device_kind or ""
  if kind.startswith(FAILING_GENERATIONS):
    return f"the Pallas TPU flash kernel does not compile on {kind} (jax issue 18595)"
  if value.shape[-1] != key.shape[-1]:
    return "the Pallas TPU flash kernel needs the value head dim to equal the key head dim"
  q_len, kv_len, head_dim = query.shape[-3], key.shape[-3], query.shape[-1]
  if q_len % LANES or kv_len % LANES:
    return (f"the Pallas TPU flash kernel needs query and key lengths that are multiples of "
            f"{LANES}, got T={q_len}, S={kv_len}")
  if head_dim > LANES and head_dim % LANES:
    return (f"the Pallas TPU flash kernel needs head_dim <= {LANES} or a multiple of {LANES}, "
            f"got {head_dim}")
  return None


def pallas_tpu_attention(query, key, value, bias=None, mask=None, *, scale: float,
                         is_causal: bool = False, block_sizes=None):
  """Flash attention on TPU: query [..., T, N, H], key/value [..., S, K, H] -> [..., T, N, H].

  ``block_sizes`` is a ``flash_attention.BlockSizes``; None takes the kernel's default (128
  everywhere). Inputs are assumed validated and servable (attention.KERNELS).

  >>> from jax.experimental.pallas import tpu as pltpu
  >>> q = k = v = jnp.ones((1, 128, 2, 128))  # [B, T, N, H]
  >>> with pltpu.force_tpu_interpret_mode():  # on CPU; on a TPU call it directly
  ...   pallas_tpu_attention(q, k, v, scale=0.125, is_causal=True).shape
  (1, 128, 2, 128)
  """
  from jax.experimental.pallas.ops.tpu import flash_attention  # pylint: disable=g-import-not-at-top

  batch_shape, (q_len, num_heads, _), kv_len = query.shape[:-3], query.shape[-3:], key.shape[-3]
  bias, mask = masks_lib.fold_infinite_bias(bias, mask)

  head_major = reference.flat_heads_first  # [..., L, N, H] -> [B, N, L, H]
  q = head_major(query * jnp.asarray(scale, query.dtype))  # the kernel would scale the bias too
  k = head_major(reference.repeat_kv_heads(key, num_heads))
  v = head_major(reference.repeat_kv_heads(value, num_heads))
  batch = q.shape[0]

  flat_mask = masks_lib.flatten_batch(mask, batch_shape)  # [B or 1, N', T', S']
  segment_ids = None
  if flat_mask is not None and flat_mask.shape[1:3] == (1, 1):  # key padding: [B', 1, 1, S']
    key_ids = jnp.broadcast_to(flat_mask[:, 0, 0, :], (batch, kv_len)).astype(jnp.int32)
    segment_ids = flash_attention.SegmentIds(q=jnp.ones((batch, q_len), jnp.int32), kv=key_ids)
    flat_mask = None
  logits_bias = masks_lib.flatten_batch(bias, batch_shape)
  if flat_mask is not None:
    logits_bias = jnp.where(flat_mask, 0.0 if logits_bias is None else logits_bias, _MASKED)
  if logits_bias is not None:
    logits_bias = jnp.broadcast_to(logits_bias.astype(jnp.float32),
                                   (batch, num_heads, q_len, kv_len))

  output = flash_attention.flash_attention(
      q, k, v, logits_bias, segment_ids, causal=bool(is_causal), sm_scale=1.0,
      block_sizes=block_sizes)  # [B, N, T, H]
  output = jnp.reshape(reference.heads_first(output), query.shape)  # [B, T, N, H] -> [..., T, N, H]
  return masks_lib.zero_empty_rows(output, mask, kv_len, is_causal=is_causal)
