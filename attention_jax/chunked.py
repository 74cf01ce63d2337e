"""Blockwise attention with an online softmax (Rabe & Staats 2021; FlashAttention, Dao et al.).

Neither direction materialises the T x S matrix: the forward pass walks key blocks with a running
row max m, row sum l and output accumulator, and keeps only the log-sum-exp per query row; the
backward pass (a custom VJP) recomputes each block's probabilities from it:

  P_ij = exp(Q_i K_j^T + bias_ij - lse_i)          (Q already multiplied by the scale)
  dV_j += P_ij^T dO_i,   dP_ij = dO_i V_j^T,   dS_ij = P_ij * (dP_ij - rowsum(dO_i * O_i))
  dQ_i += dS_ij K_j,   dK_j += dS_ij^T Q_i,   dbias_ij = dS_ij

Internally tensors are head-major, [B, N, L, H] with B the flattened batch dims, and one
(batch, head) pair is processed at a time so that each block's [bq, bk] arrays stay in cache.
Memory is linear in T and S (plus the mask and bias, at whatever size the caller gives them).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from attention_jax import masks as masks_lib
from attention_jax import reference

# The largest query and key blocks by default, measured on the 2-core CPU (B = 1, N = 8, H = 64;
# `scripts/benchmark_attention.py --rounds 7 --shapes 1,2048,8,64 1,4096,8,64 --blocks 1024x1024
# 1024x2048 1024x4096 512x4096`, and `--causal --rounds 5 --shapes 1,4096,8,64 --blocks ...`).
# Without a causal mask long key blocks win: forward at T = 4096 took 222 / 215 / 204 / 231 ms with
# those four, forward+backward 910 / 859 / 862 / 867 ms (T = 2048: 55 / 56 / 52 / 60 forward).
# Causal attention wants short key blocks, so that whole blocks above the diagonal are skipped:
# forward 163 ms with (1024, 1024), 183 with (1024, 2048), 233 with (1024, 4096), 182 with
# (512, 1024); forward+backward 588 / 649 / 830 / 616 ms.
DEFAULT_BLOCK_Q = 1024
DEFAULT_BLOCK_K = 4096
DEFAULT_BLOCK_K_CAUSAL = 1024


def _round_up(length: int, block: int) -> int:
  return -(-length // block) * block


def _block_size(length: int, requested: int | None, default: int) -> int:
  """The requested block (at most the length), or else equal blocks of at most ``default``.

  Equal blocks keep the padding small: T = 1100 gets two blocks of 552, not two of 1024.
  """
  if requested:
    return min(requested, _round_up(length, 8))
  num_blocks = -(-length // default)
  return _round_up(-(-length // num_blocks), 8)


@dataclasses.dataclass(frozen=True)
class _Blocks:
  """Static geometry: block sizes and counts, and how to cut mask/bias blocks."""
  q_len: int
  kv_len: int
  block_q: int
  block_k: int

  @classmethod
  def create(cls, q_len, kv_len, block_q=None, block_k=None, is_causal=False):
    default_k = DEFAULT_BLOCK_K_CAUSAL if is_causal else DEFAULT_BLOCK_K
    return cls(q_len, kv_len, _block_size(q_len, block_q, DEFAULT_BLOCK_Q),
               _block_size(kv_len, block_k, default_k))

  @property
  def num_q(self):
    return _round_up(self.q_len, self.block_q) // self.block_q

  @property
  def num_k(self):
    return _round_up(self.kv_len, self.block_k) // self.block_k

  def cut(self, array, i, j):
    """Block (i, j) of a [B', N', T' or 1, S' or 1] mask or bias; None stays None."""
    if array is None:
      return None
    if array.shape[-2] != 1:
      array = lax.dynamic_slice_in_dim(array, i * self.block_q, self.block_q, axis=-2)
    if array.shape[-1] != 1:
      array = lax.dynamic_slice_in_dim(array, j * self.block_k, self.block_k, axis=-1)
    return array

  def allowed(self, mask, i, j, is_causal):
    """Boolean [.., bq or 1, bk] of keys a query block may attend to in key block j; None when
    every key may be attended to (no mask, not causal, no padded keys)."""
    if mask is None and not is_causal and self.kv_len % self.block_k == 0:
      return None
    key_index = j * self.block_k + jnp.arange(self.block_k)
    allowed = (key_index < self.kv_len)[None, None, None, :]  # padded keys never
    if is_causal:
      query_index = i * self.block_q + jnp.arange(self.block_q)
      allowed = allowed & (key_index[None, :] <= query_index[:, None])[None, None]
    block_mask = self.cut(mask, i, j)
    return allowed if block_mask is None else allowed & block_mask

  def key_blocks(self, i, is_causal):
    """How many key blocks query block i needs (all, or up to the diagonal when causal)."""
    if not is_causal:
      return self.num_k
    last_query = jnp.minimum((i + 1) * self.block_q, self.q_len) - 1
    return jnp.minimum(last_query // self.block_k + 1, self.num_k)


def _logits(q_block, k_block, bias_block, allowed, dtype):
  """Q_i K_j^T + bias_ij, -inf where not allowed: [B, N, bq, bk]."""
  logits = jnp.einsum("bnqh,bnkh->bnqk", q_block, k_block, preferred_element_type=dtype)
  logits = logits if bias_block is None else logits + bias_block
  return logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)


def _forward(q, k, v, bias, mask, is_causal, geometry):
  """q [B, N, Tp, H], k [B, N, Sp, H], v [B, N, Sp, Hv] -> out [B, N, Tp, Hv], lse [B, N, Tp]."""
  dtype = reference.compute_dtype(q.dtype)
  g = geometry
  batch, heads, _, value_dim = v.shape[0], v.shape[1], v.shape[2], v.shape[3]

  def query_block(i):
    q_block = lax.dynamic_slice_in_dim(q, i * g.block_q, g.block_q, axis=2)

    def key_step(j, carry):
      row_max, row_sum, acc = carry
      k_block = lax.dynamic_slice_in_dim(k, j * g.block_k, g.block_k, axis=2)
      v_block = lax.dynamic_slice_in_dim(v, j * g.block_k, g.block_k, axis=2)
      logits = _logits(q_block, k_block, g.cut(bias, i, j), g.allowed(mask, i, j, is_causal),
                       dtype)
      new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))
      safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
      correction = jnp.exp(row_max - safe_max)  # 0 while the row had nothing
      probs = jnp.exp(logits - safe_max[..., None])
      row_sum = row_sum * correction + jnp.sum(probs, axis=-1)
      acc = acc * correction[..., None] + jnp.einsum(
          "bnqk,bnkh->bnqh", probs.astype(v.dtype), v_block, preferred_element_type=dtype)
      return new_max, row_sum, acc

    shape = (batch, heads, g.block_q)
    init = (jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype),
            jnp.zeros(shape + (value_dim,), dtype))
    row_max, row_sum, acc = lax.fori_loop(0, g.key_blocks(i, is_causal), key_step, init)
    has_key = row_sum > 0.0
    out = acc / jnp.where(has_key, row_sum, 1.0)[..., None]
    lse = jnp.where(has_key, row_max + jnp.log(jnp.where(has_key, row_sum, 1.0)), jnp.inf)
    return out, lse  # an empty row: out 0, lse +inf so that exp(logit - lse) = 0 later

  out, lse = lax.map(query_block, jnp.arange(g.num_q))  # [Q, B, N, bq, Hv], [Q, B, N, bq]
  out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, g.num_q * g.block_q, value_dim)
  lse = jnp.moveaxis(lse, 0, 2).reshape(batch, heads, g.num_q * g.block_q)
  return out.astype(q.dtype), lse


def _backward(q, k, v, bias, mask, is_causal, geometry, out, lse, d_out):
  dtype = reference.compute_dtype(q.dtype)
  g = geometry
  delta = jnp.sum(d_out.astype(dtype) * out.astype(dtype), axis=-1)  # rowsum(dO * O) [B, N, Tp]

  def block_grads(i, j):
    """dS and P for block (i, j), plus the slices they came from."""
    q_block = lax.dynamic_slice_in_dim(q, i * g.block_q, g.block_q, axis=2)
    k_block = lax.dynamic_slice_in_dim(k, j * g.block_k, g.block_k, axis=2)
    v_block = lax.dynamic_slice_in_dim(v, j * g.block_k, g.block_k, axis=2)
    do_block = lax.dynamic_slice_in_dim(d_out, i * g.block_q, g.block_q, axis=2)
    lse_block = lax.dynamic_slice_in_dim(lse, i * g.block_q, g.block_q, axis=2)
    delta_block = lax.dynamic_slice_in_dim(delta, i * g.block_q, g.block_q, axis=2)
    logits = _logits(q_block, k_block, g.cut(bias, i, j), g.allowed(mask, i, j, is_causal),
                     dtype)
    probs = jnp.exp(logits - lse_block[..., None])  # 0 where masked, and on empty rows
    d_probs = jnp.einsum("bnqh,bnkh->bnqk", do_block, v_block, preferred_element_type=dtype)
    d_logits = probs * (d_probs - delta_block[..., None])
    return q_block, k_block, do_block, probs, d_logits

  # One pass: key blocks outside (dK_j, dV_j accumulate locally), query blocks inside (dQ_i and
  # dbias accumulate in place in carried buffers), so each P_ij is computed once.
  def key_block(carry, j):
    def query_step(i, inner):
      d_k, d_v, d_q, d_bias = inner
      q_block, k_block, do_block, probs, d_logits = block_grads(i, j)
      d_v = d_v + jnp.einsum("bnqk,bnqh->bnkh", probs.astype(do_block.dtype), do_block,
                             preferred_element_type=dtype)
      d_k = d_k + jnp.einsum("bnqk,bnqh->bnkh", d_logits.astype(q.dtype), q_block,
                             preferred_element_type=dtype)
      d_q_block = lax.dynamic_slice_in_dim(d_q, i * g.block_q, g.block_q, axis=2)
      d_q_block = d_q_block + jnp.einsum(
          "bnqk,bnkh->bnqh", d_logits.astype(k.dtype), k_block, preferred_element_type=dtype)
      d_q = lax.dynamic_update_slice_in_dim(d_q, d_q_block, i * g.block_q, axis=2)
      if d_bias is not None:
        d_bias = _accumulate_bias(d_bias, d_logits, i, j, g)
      return d_k, d_v, d_q, d_bias

    d_q, d_bias = carry
    first = (j * g.block_k) // g.block_q if is_causal else 0  # the first block that sees j
    init = (jnp.zeros(k.shape[:2] + (g.block_k, k.shape[3]), dtype),
            jnp.zeros(v.shape[:2] + (g.block_k, v.shape[3]), dtype), d_q, d_bias)
    d_k, d_v, d_q, d_bias = lax.fori_loop(first, g.num_q, query_step, init)
    return (d_q, d_bias), (d_k, d_v)

  d_bias = None if bias is None else jnp.zeros(bias.shape, dtype)
  (d_q, d_bias), (d_k, d_v) = lax.scan(key_block, (jnp.zeros(q.shape, dtype), d_bias),
                                       jnp.arange(g.num_k))
  d_k = jnp.moveaxis(d_k, 0, 2).reshape(k.shape)  # [K blocks, B, N, bk, H] -> [B, N, Sp, H]
  d_v = jnp.moveaxis(d_v, 0, 2).reshape(v.shape)
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), d_bias


def _accumulate_bias(d_bias, d_logits, i, j, g):
  """Adds block (i, j) of dS into d_bias, summing over the axes that bias broadcasts along."""
  summed = [axis for axis in range(4) if d_bias.shape[axis] == 1 and d_logits.shape[axis] != 1]
  block = jnp.sum(d_logits, axis=tuple(summed), keepdims=True) if summed else d_logits
  start = [0, 0, i * g.block_q if d_bias.shape[2] != 1 else 0,
           j * g.block_k if d_bias.shape[3] != 1 else 0]
  current = lax.dynamic_slice(d_bias, start, block.shape)
  return lax.dynamic_update_slice(d_bias, current + block.astype(d_bias.dtype), start)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, bias, mask, is_causal, geometry):
  return _forward(q, k, v, bias, mask, is_causal, geometry)[0]


def _attention_fwd(q, k, v, bias, mask, is_causal, geometry):
  out, lse = _forward(q, k, v, bias, mask, is_causal, geometry)
  return out, (q, k, v, bias, mask, out, lse)


def _attention_bwd(is_causal, geometry, residuals, d_out):
  q, k, v, bias, mask, out, lse = residuals
  d_q, d_k, d_v, d_bias = _backward(q, k, v, bias, mask, is_causal, geometry, out, lse, d_out)
  return d_q, d_k, d_v, d_bias, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _pad_axis(array, axis, length):
  """Zero-pads ``axis`` to ``length`` unless it is a broadcast axis of size 1."""
  if array is None or array.shape[axis] in (1, length):
    return array
  widths = [(0, 0)] * array.ndim
  widths[axis] = (0, length - array.shape[axis])
  return jnp.pad(array, widths)


def chunked_attention(query, key, value, bias=None, mask=None, *, scale: float,
                      is_causal: bool = False, block_q: int | None = None,
                      block_k: int | None = None):
  """Memory-efficient attention, blockwise in both directions; same contract as the reference.

  query [..., T, N, H], key [..., S, K, H], value [..., S, K, H_v] -> [..., T, N, H_v]. Blocks of
  ``block_q`` queries and ``block_k`` keys (default: equal blocks, a multiple of 8, of at most 1024
  queries and 4096 keys, or 1024 keys when causal).
  Inputs are assumed validated.

  >>> chunked_attention(q, k, v, scale=0.125, is_causal=True, block_q=256, block_k=256)
  """
  batch_shape, (q_len, num_heads, _) = query.shape[:-3], query.shape[-3:]
  kv_len = key.shape[-3]
  geometry = _Blocks.create(q_len, kv_len, block_q, block_k, is_causal)
  padded_q, padded_k = geometry.num_q * geometry.block_q, geometry.num_k * geometry.block_k

  def head_major(x, length):  # [..., L, N, H] -> [B, N, L_padded, H]
    return _pad_axis(reference.flat_heads_first(x), 2, length)

  q = head_major(query * jnp.asarray(scale, query.dtype), padded_q)  # autodiff applies the scale
  k = head_major(reference.repeat_kv_heads(key, num_heads), padded_k)
  v = head_major(reference.repeat_kv_heads(value, num_heads), padded_k)
  def pad_logits(x):  # a mask or bias -> [B or 1, N or 1, T_padded or 1, S_padded or 1]
    return _pad_axis(_pad_axis(masks_lib.flatten_batch(x, batch_shape), 2, padded_q), 3, padded_k)

  bias, mask = pad_logits(bias), pad_logits(mask)
  batch = q.shape[0]

  def one_head(inputs):
    """One (batch, head) at a time keeps each block's [bq, bk] arrays in cache."""
    q_head, k_head, v_head, index = inputs  # [L_padded, H] each
    b, n = index // num_heads, index % num_heads
    def pick(x):  # this head's [1, 1, T or 1, S or 1] slice of a mask or bias
      if x is None:
        return None
      x = lax.dynamic_index_in_dim(x, b if x.shape[0] > 1 else 0, 0)
      return lax.dynamic_index_in_dim(x, n if x.shape[1] > 1 else 0, 1)
    out = _attention(q_head[None, None], k_head[None, None], v_head[None, None], pick(bias),
                     pick(mask), bool(is_causal), geometry)
    return out[0, 0]  # [T_padded, H_v]

  flat = lambda x: jnp.reshape(x, (batch * num_heads,) + x.shape[2:])  # [B * N, L, H]
  out = lax.map(one_head, (flat(q), flat(k), flat(v), jnp.arange(batch * num_heads)))
  out = jnp.reshape(out, (batch, num_heads) + out.shape[1:])  # [B, N, T_padded, H_v]
  out = reference.heads_first(out[:, :, :q_len])  # [B, T, N, H_v]
  return jnp.reshape(out, batch_shape + out.shape[1:])
