"""Blockwise attention with an online softmax (:ref:`Rabe & Staats 2021 <ref-rabe2021>`;
FlashAttention, :ref:`Dao et al. 2022 <ref-dao2022>`).

Neither direction materialises the T x S matrix: the forward pass walks key blocks with a running
row max, row sum and output, keeping the log-sum-exp per row; the backward pass (a custom VJP)
recomputes each block's probabilities from it:

  Z_ij = Q_i K_j^T  (Q already multiplied by the scale),  optionally Z = cap * tanh(Z / cap)
  P_ij = exp(Z_ij + bias_ij - lse_i)
  dV_j += P_ij^T dO_i,   dP_ij = dO_i V_j^T,   dS_ij = P_ij * (dP_ij - rowsum(dO_i * O_i))
  dZ_ij = dS_ij (times 1 - tanh^2 under the cap),   dbias_ij = dS_ij
  dQ_i += dZ_ij K_j,   dK_j += dZ_ij^T Q_i

Grouped-query attention runs the G query heads of a key/value head against its keys and values,
never copied. Key blocks that the causal mask, the window, the lengths, the segment ids or a
block mask rule out are skipped. Internally tensors are head-major, [B, N, L, H], one (example,
head) pair at a time, or a few side by side where blocks are small (``Blocks.pairs_per_step``).
Memory is linear in T and S (plus the mask and bias as given). Forward and reverse mode: the
kernel is a custom JVP whose tangent (one more blockwise pass, ``_tangent_head``) transposes to
the backward pass above (attention_jax.tangent), so grad costs what a custom VJP would. The
log-sum-exp has its tangent too (d lse_i = sum_j P_ij dZ_ij), and its cotangent enters the
backward pass as rowsum(dO * O) - d lse. Second order stays blockwise: forward over reverse
(hessians) differentiates the backward pass, and reverse over forward (grad of a jvp) transposes
the tangent's derivative in the inputs, by the symmetry of second derivatives, to forward mode
through the backward pass (attention_jax.tangent's docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from attention_jax import _checks
from attention_jax import blocks
from attention_jax import masks as masks_lib
from attention_jax import mods as mods_lib
from attention_jax import reference
from attention_jax import structure
from attention_jax import tangent as tangent_lib

@dataclasses.dataclass(frozen=True)
class Pattern:
  """The static part of which keys a query sees and how its logits are shaped, as
  ``dot_product_attention``'s arguments; the mods as ``mods.Mod.fn``, ``fn(consts, *scalars)``."""
  is_causal: bool = False
  window: tuple[int, int] | None = None
  soft_cap: float | None = None
  score_mod: Callable | None = None
  mask_mod: Callable | None = None
  normalizer: str = "softmax"
  sigmoid_bias: float = 0.0
  dropout_rate: float = 0.0
  max_scores: bool = False  # the forward also returns each row's largest logit

  @property
  def reach(self) -> tuple[int | None, int | None]:
    """(before, after) of the causal mask and the window, as ``structure.reach`` gives them."""
    return structure.reach(self.is_causal, self.window)


class _Extras(NamedTuple):
  """Per example of the flattened batch, or None: segment ids and positions [B or 1, Lp] (the
  causal mask and window read positions, where given, instead of indices), lengths [B]."""
  q_segments: jax.Array | None = None
  kv_segments: jax.Array | None = None
  q_lengths: jax.Array | None = None
  kv_lengths: jax.Array | None = None
  q_positions: jax.Array | None = None
  kv_positions: jax.Array | None = None


class Mods(NamedTuple):
  """The mods' constants (tuples), the sinks [N] and the block kinds [B or 1, N or 1, Q, K]."""
  score_consts: tuple = ()
  mask_consts: tuple = ()
  sinks: jax.Array | None = None
  block_kinds: jax.Array | None = None
  anchor: jax.Array | None = None  # what the mods' inputs vary like (mods.anchor_of)
  dropout_keys: jax.Array | None = None  # uint32 [B or 1, N or 1, 2] (blocks.head_keys)


class _Head(NamedTuple):
  """One query head of one example: bias and mask [T' or 1, S' or 1], the _Extras' [Lp] and
  scalars, its indices, sink, block kinds [Q, K] and the mods' constants; None when absent."""
  bias: jax.Array | None
  mask: jax.Array | None
  q_segments: jax.Array | None
  kv_segments: jax.Array | None
  q_length: jax.Array | None
  kv_length: jax.Array | None
  q_positions: jax.Array | None
  kv_positions: jax.Array | None
  batch: jax.Array | None = None
  head: jax.Array | None = None
  sink: jax.Array | None = None
  block_kinds: jax.Array | None = None
  score_consts: tuple = ()
  mask_consts: tuple = ()
  anchor: jax.Array | None = None
  dropout_key: jax.Array | None = None  # uint32 [2]: this head's (blocks.head_keys)


def _occupied(kinds, lo, hi):
  """[lo, hi) narrowed to the first and last block that ``kinds`` does not call empty."""
  occupied = kinds != blocks.EMPTY
  first = jnp.argmax(occupied)  # 0 when none is occupied
  last = occupied.shape[0] - jnp.argmax(occupied[::-1])  # one past the last occupied
  return jnp.maximum(lo, first), jnp.minimum(hi, jnp.where(jnp.any(occupied), last, 0))


def varying_zeros(shape, dtype, *like):
  """Zeros that vary over the shard_map axes of the arrays ``like`` (check_vma's loop carries)."""
  return mods_lib.anchor_of(*like, shape=shape, dtype=dtype)


class Blocks(blocks.Geometry):
  """The block geometry with the kernel's rules: which blocks can attend, and their masks."""

  def span(self, fixed, pattern: Pattern, head: _Head, *, row: bool):
    """Blocks [lo, hi) of the other axis that block ``fixed`` may meet (``row``: the key blocks
    of query block ``fixed``, else the query blocks of key block ``fixed``); empty when none."""
    size, other, length, own_length, other_length, num = (
        (self.block_q, self.block_k, self.q_len, head.q_length, head.kv_length, self.num_k) if row
        else (self.block_k, self.block_q, self.kv_len, head.kv_length, head.q_length, self.num_q))
    first = fixed * size
    last = jnp.minimum((fixed + 1) * size, length) - 1  # the last real index: < first if empty
    last = last if own_length is None else jnp.minimum(last, own_length - 1)
    lo, hi = 0, num
    if head.q_positions is None:  # explicit positions: blocks are skipped one by one
      # the other axis's reach before and after this block's positions (None: unbounded)
      before, after = pattern.reach if row else pattern.reach[::-1]
      if before is not None:
        lo = jnp.maximum(lo, (first - before) // other)
      if after is not None:
        hi = jnp.minimum(hi, (last + after) // other + 1)
    if other_length is not None:
      hi = jnp.minimum(hi, -(-other_length // other))
    if head.block_kinds is not None:
      lo, hi = _occupied(head.block_kinds[fixed] if row else head.block_kinds[:, fixed], lo, hi)
    return lo, jnp.where(last < first, lo, hi)

  def mod_indices(self, i, j, head: _Head):
    """The query [bq, 1] and key [1, bk] indices the mods see in block (i, j): the positions
    where given, else the indices, padding clamped to the last real one (lookups in bounds)."""
    if head.q_positions is not None:
      query_index, key_index = self.block_ids(head.q_positions, head.kv_positions, i, j)
      return query_index.astype(jnp.int32)[:, None], key_index.astype(jnp.int32)[None, :]
    query_index = jnp.minimum(i * self.block_q + jnp.arange(self.block_q), self.q_len - 1)
    key_index = jnp.minimum(j * self.block_k + jnp.arange(self.block_k), self.kv_len - 1)
    return query_index.astype(jnp.int32)[:, None], key_index.astype(jnp.int32)[None, :]

  def allowed(self, i, j, pattern: Pattern, head: _Head, full: bool = False):
    """Boolean [bq or 1, bk] of the pairs of block (i, j) that may attend; None when all may
    (``full``: the block mask says the mask_mod allows them all)."""
    query_index = (i * self.block_q + jnp.arange(self.block_q))[:, None]  # [bq, 1]
    key_index = (j * self.block_k + jnp.arange(self.block_k))[None, :]  # [1, bk]
    query_position, key_position = (
        (query_index, key_index) if head.q_positions is None else self.mod_indices(i, j, head))
    parts = [self.cut(head.mask, i, j)]
    if self.kv_len % self.block_k:
      parts.append(key_index < self.kv_len)  # padded keys never
    if head.kv_length is not None:
      parts.append(key_index < head.kv_length)
    if head.q_length is not None:
      parts.append(query_index < head.q_length)
    parts += structure.band_meets(query_position, query_position, key_position, key_position,
                                  pattern.reach)
    if head.q_segments is not None:
      q_ids, kv_ids = self.block_ids(head.q_segments, head.kv_segments, i, j)
      parts.append(q_ids[:, None] == kv_ids[None, :])
    if pattern.mask_mod is not None and not full:
      parts.append(mods_lib.pointwise(pattern.mask_mod, head.mask_consts, head.batch, head.head,
                                      *self.mod_indices(i, j, head), anchor=head.anchor))
    return masks_lib.combine_masks(*parts)

  def unless_skipped(self, step, carry, i, j, pattern: Pattern, head: _Head):
    """step(carry, full), or carry when block (i, j) is ruled out whole: by its segment ids,
    positions (causal, window) or the block mask (``full``: the mask_mod allows every pair)."""
    could_attend = []
    kind = None if head.block_kinds is None else head.block_kinds[i, j]
    if kind is not None:
      could_attend.append(kind != blocks.EMPTY)
    extremes = lambda q, kv: (jnp.min(q), jnp.max(q), jnp.min(kv), jnp.max(kv))
    if head.q_segments is not None:
      could_attend.append(structure.segments_meet(*extremes(*self.block_ids(
          head.q_segments, head.kv_segments, i, j))))
    if head.q_positions is not None and pattern.reach[1] is not None:  # causal or windowed
      could_attend += structure.band_meets(*extremes(*self.block_ids(
          head.q_positions, head.kv_positions, i, j)), pattern.reach)
    if not could_attend:
      return step(carry, False)
    go = functools.reduce(jnp.logical_and, could_attend)
    if kind is None or pattern.mask_mod is None:
      return lax.cond(go, lambda c: step(c, False), lambda c: c, carry)
    branch = jnp.where(go, jnp.where(kind == blocks.FULL, 2, 1), 0)
    return lax.switch(branch, [lambda c: c, lambda c: step(c, False), lambda c: step(c, True)],
                      carry)

  def along(self, fixed, step, carry, pattern: Pattern, head: _Head, *, row: bool):
    """``step(carry, other, full)`` over the blocks that block ``fixed`` meets (``span``).

    With a block mask and no id-based skips, its full blocks run in one loop and its partial
    ones in a second, so that no block pays for a branch; else each block is checked
    (``unless_skipped``)."""
    lo, hi = self.span(fixed, pattern, head, row=row)
    pair = (lambda other: (fixed, other)) if row else (lambda other: (other, fixed))
    by_ids = head.q_segments is not None or (
        head.q_positions is not None and pattern.reach[1] is not None)
    if head.block_kinds is None or pattern.mask_mod is None or by_ids:
      return lax.fori_loop(lo, hi, lambda other, c: self.unless_skipped(
          lambda c, full: step(c, other, full), c, *pair(other), pattern, head), carry)
    kinds = head.block_kinds[fixed] if row else head.block_kinds[:, fixed]  # [K] or [Q]
    index = jnp.arange(kinds.shape[0])
    kinds = jnp.where((index >= lo) & (index < hi), kinds, blocks.EMPTY)
    order = jnp.argsort(-kinds.astype(jnp.int32), stable=True)  # full, partial, then empty
    num_full = jnp.sum(kinds == blocks.FULL)
    num_partial = jnp.sum(kinds == blocks.PARTIAL)
    carry = lax.fori_loop(0, num_full, lambda t, c: step(c, order[t], True), carry)
    return lax.fori_loop(num_full, num_full + num_partial,
                         lambda t, c: step(c, order[t], False), carry)


def _logits(q_block, k_block, i, j, pattern: Pattern, head: _Head, geometry: Blocks, dtype,
            transposed=False, full=False, pullback=False):
  """(logits [bq, bk]: Z_ij + bias_ij through the score_mod, masked; tanh(Z / cap) or None; and
  with ``pullback`` the score_mod's VJP or None), [bk, bq] from K_j Q_i^T with ``transposed``."""
  turn = (lambda x: None if x is None else x.T) if transposed else (lambda x: x)
  logits = (jnp.einsum("kh,qh->kq", k_block, q_block, preferred_element_type=dtype) if transposed
            else jnp.einsum("qh,kh->qk", q_block, k_block, preferred_element_type=dtype))
  squashed = None
  if pattern.soft_cap is not None:
    squashed = jnp.tanh(logits / pattern.soft_cap)
    logits = pattern.soft_cap * squashed
  bias = turn(geometry.cut(head.bias, i, j))
  logits = logits if bias is None else logits + bias
  vjp = None
  if pattern.score_mod is not None:  # a function of the logits and the trainable constants
    q_idx, kv_idx = map(turn, geometry.mod_indices(i, j, head))  # [bq, 1], [1, bk] (turned)
    consts = head.score_consts

    def score(logits, trained):
      return mods_lib.pointwise(pattern.score_mod, with_trained(consts, trained), logits,
                                head.batch, head.head, q_idx, kv_idx, anchor=head.anchor)
    trained = tuple(c for c in consts if mods_lib.is_trainable(c))
    logits, vjp = jax.vjp(score, logits, trained) if pullback else (score(logits, trained), None)
  allowed = turn(geometry.allowed(i, j, pattern, head, full))
  masked = reference.masked_logit(logits.dtype)  # finite: jax.debug_infs stays quiet
  logits = logits if allowed is None else jnp.where(allowed, logits, masked)
  return (logits, squashed, vjp) if pullback else (logits, squashed)


def _kept(pattern: Pattern, head: _Head, g: Blocks, i, j, transposed=False):
  """``blocks.dropout_keep`` on block (i, j) under this head's key: True where kept, [bq, bk]
  ([bk, bq] ``transposed``); None without dropout."""
  if not pattern.dropout_rate:
    return None
  q_idx = (i * g.block_q + jnp.arange(g.block_q))[:, None]  # [bq, 1]
  kv_idx = (j * g.block_k + jnp.arange(g.block_k))[None, :]  # [1, bk]
  kept = blocks.dropout_keep(head.dropout_key, q_idx, kv_idx, pattern.dropout_rate)
  return kept.T if transposed else kept


def _forward_head(q, k, v, head: _Head, pattern: Pattern, g: Blocks):
  """q [Tp, H], k [Sp, H], v [Sp, Hv] -> out [Tp, Hv] (compute dtype), lse [Tp]
  (``reference.least_row_max`` where a row has no key and no sink; zeros for the sigmoid, which
  has no normaliser and so no running max). A sink s adds exp(s) to each row's denominator: the
  running max and sum start at s and 1 instead of least_max and 0."""
  dtype = reference.compute_dtype(q.dtype)
  least_max = reference.least_row_max(dtype)  # a masked logit minus it underflows to exp = 0
  sink = None if head.sink is None else head.sink.astype(dtype)
  start_max = least_max if sink is None else jnp.maximum(sink, least_max)
  product = lambda p, v_block: jnp.einsum("qk,kh->qh", p.astype(v.dtype), v_block,
                                          preferred_element_type=dtype)

  def with_sink(row_max, row_sum):  # adds exp(sink - row_max) to the row sums
    return row_sum if sink is None else row_sum + jnp.exp(sink - row_max)

  def query_block(i):
    q_block = lax.dynamic_slice_in_dim(q, i * g.block_q, g.block_q)

    def attend(carry, j, full):
      k_block = lax.dynamic_slice_in_dim(k, j * g.block_k, g.block_k)
      v_block = lax.dynamic_slice_in_dim(v, j * g.block_k, g.block_k)
      logits, _ = _logits(q_block, k_block, i, j, pattern, head, g, dtype, full=full)
      kept = _kept(pattern, head, g, i, j)
      dropped = (lambda p: p) if kept is None else (lambda p: jnp.where(kept, p, 0.0))
      if pattern.normalizer == "sigmoid":  # sum_j sigmoid(Z_ij + b) V_j, 0 where masked
        return carry + product(dropped(jax.nn.sigmoid(logits + pattern.sigmoid_bias)), v_block)
      row_max, row_sum, acc = carry
      new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))  # >= least_max: finite
      correction = jnp.exp(row_max - new_max)
      probs = jnp.exp(logits - new_max[:, None])  # 0 where masked
      row_sum = row_sum * correction + jnp.sum(probs, axis=-1)  # dropout keeps the normaliser
      return new_max, row_sum, acc * correction[:, None] + product(dropped(probs), v_block)

    acc = varying_zeros((g.block_q, v.shape[-1]), dtype, q, k, v, head)
    if pattern.normalizer == "sigmoid":
      out = g.along(i, attend, acc, pattern, head, row=True)
      out = out * blocks.dropout_scale(pattern.dropout_rate)
      return out, jnp.zeros((g.block_q,), dtype)
    if g.num_k == 1:  # all keys in one block: a plain softmax, with nothing to rescale
      logits, _ = _logits(q_block, k, i, 0, pattern, head, g, dtype)
      row_max = jnp.maximum(jnp.max(logits, axis=-1, initial=least_max), start_max)
      probs = jnp.exp(logits - row_max[:, None])  # 0 where masked
      row_sum = with_sink(row_max, jnp.sum(probs, axis=-1))
      kept = _kept(pattern, head, g, i, 0)
      acc = product(probs if kept is None else jnp.where(kept, probs, 0.0), v)
    else:
      zeros = varying_zeros((g.block_q,), dtype, q, k, v, head)
      init = (zeros + start_max, with_sink(zeros + start_max, zeros), acc)
      row_max, row_sum, acc = g.along(i, attend, init, pattern, head, row=True)
    has_key = row_sum > 0.0
    scale = blocks.dropout_scale(pattern.dropout_rate)
    out = acc * (scale / jnp.where(has_key, row_sum, 1.0))[:, None]
    lse = jnp.where(has_key, row_max + jnp.log(jnp.where(has_key, row_sum, 1.0)), least_max)
    # an empty row: out 0, lse = least_max, so that exp(logit - lse) = 0 later
    return (out, lse) + ((jnp.where(has_key, row_max, least_max),) if pattern.max_scores else ())

  outputs = lax.map(query_block, jnp.arange(g.num_q))  # [Q, bq, Hv], [Q, bq] (, [Q, bq])
  return (outputs[0].reshape(-1, v.shape[-1]),) + tuple(x.reshape(-1) for x in outputs[1:])


def _backward_head(q, k, v, out, lse, d_out, head: _Head, pattern: Pattern, g: Blocks, d_bias,
                   d_mod=(), d_lse=None):
  """One query head against its key/value head: (dQ [Tp, H], dK [Sp, H], dV [Sp, Hv], dbias
  accumulated into ``d_bias`` [T' or 1, S' or 1] or None, and the gradients of the score_mod's
  trainable constants accumulated into ``d_mod``). ``d_lse`` [Tp] or None: the log-sum-exp's
  cotangent, which adds P_ij d_lse_i to dS_ij (d lse_i / d Z_ij = P_ij, the undropped P)."""
  dtype = reference.compute_dtype(q.dtype)
  delta = jnp.sum(d_out.astype(dtype) * out.astype(dtype), axis=-1)  # rowsum(dO * O) [Tp]
  if d_lse is not None and pattern.normalizer != "sigmoid":  # the sigmoid's lse is constant
    delta = delta - d_lse.astype(dtype)
  if pattern.dropout_rate:  # dropout's 1 / (1 - rate), once here rather than on every dP, dV
    scale = blocks.dropout_scale(pattern.dropout_rate)
    d_out = (d_out.astype(dtype) * scale).astype(d_out.dtype)

  # Key blocks outside, query blocks inside, so each P_ij is computed once. Blocks are
  # transposed, [bk, bq], so that the gradient products are plain matrix products (XLA's CPU
  # backend runs transposed operands markedly slower): dQ accumulates transposed, from K^T.
  k_t = lax.optimization_barrier(k.T)  # kept, not folded back into the product

  def key_block(carry, j):
    k_block = lax.dynamic_slice_in_dim(k, j * g.block_k, g.block_k)
    v_block = lax.dynamic_slice_in_dim(v, j * g.block_k, g.block_k)
    k_t_block = lax.dynamic_slice_in_dim(k_t, j * g.block_k, g.block_k, axis=1)

    def attend(inner, i, full):
      d_k, d_v, d_q_t, d_bias, d_mod = inner
      rows = lambda x: lax.dynamic_slice_in_dim(x, i * g.block_q, g.block_q)
      q_block, do_block = rows(q), rows(d_out)
      logits_t, squashed_t, mod_vjp = _logits(q_block, k_block, i, j, pattern, head, g, dtype,
                                              transposed=True, full=full,
                                              pullback=True)  # [bk, bq]
      d_probs_t = jnp.einsum("kh,qh->kq", v_block, do_block, preferred_element_type=dtype)
      kept_t = _kept(pattern, head, g, i, j, transposed=True)  # [bk, bq] or None
      if kept_t is not None:  # out = c (P * keep) V: dP = c keep dO V^T, dV = (P * keep)^T c dO
        d_probs_t = jnp.where(kept_t, d_probs_t, 0.0)  # (c is in d_out already)
      if pattern.normalizer == "sigmoid":
        probs_t = jax.nn.sigmoid(logits_t + pattern.sigmoid_bias)  # 0 where masked
        d_logits_t = d_probs_t * probs_t * (1.0 - probs_t)
      else:
        probs_t = jnp.exp(logits_t - rows(lse)[None, :])  # 0 where masked, and on empty rows
        d_logits_t = probs_t * (d_probs_t - rows(delta)[None, :])  # dS^T = d(Z + bias)^T
      if mod_vjp is not None:  # through the score_mod, to its input and its constants
        d_logits_t, d_trained = mod_vjp(d_logits_t)
        d_mod = tuple(a + b.astype(a.dtype) for a, b in zip(d_mod, d_trained))
      if d_bias is not None:
        d_bias = _accumulate_bias(d_bias, d_logits_t.T, i, j, g)
      if squashed_t is not None:
        d_logits_t = d_logits_t * (1.0 - squashed_t * squashed_t)  # through cap * tanh(Z / cap)
      dropped_t = probs_t if kept_t is None else jnp.where(kept_t, probs_t, 0.0)
      d_v = d_v + jnp.einsum("kq,qh->kh", dropped_t.astype(d_out.dtype), do_block,
                             preferred_element_type=dtype)
      d_k = d_k + jnp.einsum("kq,qh->kh", d_logits_t.astype(q.dtype), q_block,
                             preferred_element_type=dtype)
      d_q_t_block = lax.dynamic_slice_in_dim(d_q_t, i * g.block_q, g.block_q, axis=1)
      d_q_t_block = d_q_t_block + jnp.einsum("hk,kq->hq", k_t_block, d_logits_t.astype(k.dtype),
                                             preferred_element_type=dtype)
      d_q_t = lax.dynamic_update_slice_in_dim(d_q_t, d_q_t_block, i * g.block_q, axis=1)
      return d_k, d_v, d_q_t, d_bias, d_mod

    d_q_t, d_bias, d_mod = carry
    like = (q, k, v, d_out, head)
    init = (varying_zeros((g.block_k, k.shape[-1]), dtype, *like),
            varying_zeros((g.block_k, v.shape[-1]), dtype, *like), d_q_t, d_bias, d_mod)
    d_k, d_v, d_q_t, d_bias, d_mod = g.along(j, attend, init, pattern, head, row=False)
    return (d_q_t, d_bias, d_mod), (d_k, d_v)

  init = (varying_zeros(q.shape[::-1], dtype, q, k, v, d_out, head), d_bias, d_mod)  # dQ^T [H, Tp]
  (d_q_t, d_bias, d_mod), (d_k, d_v) = lax.scan(key_block, init, jnp.arange(g.num_k))
  # [K blocks, bk, .] -> [Sp, .]
  return d_q_t.T, d_k.reshape(k.shape), d_v.reshape(v.shape), d_bias, d_mod


def _tangent_head(q, k, v, out, lse, d_q, d_k, d_v, head: _Head, d_head: _Head,
                  pattern: Pattern, g: Blocks):
  """The tangents of ``_forward_head``'s out [Tp, Hv] and lse [Tp] from the tangents of q, k, v
  and of the head's bias, sink and trainable score_mod constants (``d_head``'s), one key block
  at a time:

    dZ_ij = jvp of the block's logits (soft cap, bias, score_mod and mask included)
    d lse_i = sum_j P_ij dZ_ij + p_sink d sink
    dO_i = c sum_j keep * P_ij (dZ_ij V_j + dV_j) - d lse_i O_i

  with P_ij = exp(Z_ij - lse_i) from the forward's log-sum-exp (the normaliser's tangent reads
  the undropped P) and p_sink = exp(sink - lse_i); the sigmoid's is
  c sum_j keep (s (1 - s) dZ_ij V_j + s dV_j), s = sigmoid(Z_ij + b)."""
  dtype = reference.compute_dtype(q.dtype)
  trained, d_trained = trainable(head), trainable(head, d_head.score_consts)
  product = lambda p, v_block: jnp.einsum("qk,kh->qh", p.astype(dtype), v_block.astype(dtype),
                                          preferred_element_type=dtype)

  def query_block(i):
    rows = lambda x: lax.dynamic_slice_in_dim(x, i * g.block_q, g.block_q)
    q_block, d_q_block, lse_block = rows(q), rows(d_q), rows(lse).astype(dtype)

    def attend(carry, j, full):
      cols = lambda x: lax.dynamic_slice_in_dim(x, j * g.block_k, g.block_k)

      def logits_of(q_block, k_block, bias, trained):
        consts = with_trained(head.score_consts, trained)
        return _logits(q_block, k_block, i, j, pattern,
                       head._replace(bias=bias, score_consts=consts), g, dtype, full=full)[0]
      logits, d_logits = jax.jvp(logits_of, (q_block, cols(k), head.bias, trained),
                                 (d_q_block, cols(d_k), d_head.bias, d_trained))
      logits, d_logits = logits.astype(dtype), d_logits.astype(dtype)
      kept = _kept(pattern, head, g, i, j)
      dropped = (lambda p: p) if kept is None else (lambda p: jnp.where(kept, p, 0.0))
      if pattern.normalizer == "sigmoid":
        probs = jax.nn.sigmoid(logits + pattern.sigmoid_bias)
        return carry + product(dropped(probs * (1.0 - probs) * d_logits), cols(v)) + product(
            dropped(probs), cols(d_v))
      acc, d_normaliser = carry
      probs = jnp.exp(logits - lse_block[:, None])  # 0 where masked, and on empty rows
      acc = acc + product(dropped(probs * d_logits), cols(v)) + product(dropped(probs), cols(d_v))
      return acc, d_normaliser + jnp.sum(probs * d_logits, axis=-1)

    acc = varying_zeros((g.block_q, v.shape[-1]), dtype, q, k, v, head)
    d_normaliser = varying_zeros((g.block_q,), dtype, q, k, v, head)
    scale = blocks.dropout_scale(pattern.dropout_rate)
    if pattern.normalizer == "sigmoid":  # no normaliser: lse is 0
      return scale * g.along(i, attend, acc, pattern, head, row=True), d_normaliser
    acc, d_normaliser = g.along(i, attend, (acc, d_normaliser), pattern, head, row=True)
    if head.sink is not None:  # the sink's share of the row, exp(sink - lse), times its tangent
      p_sink = jnp.exp(head.sink.astype(dtype) - lse_block)
      d_normaliser = d_normaliser + p_sink * d_head.sink.astype(dtype)
    return scale * acc - d_normaliser[:, None] * rows(out).astype(dtype), d_normaliser

  d_out, d_lse = lax.map(query_block, jnp.arange(g.num_q))  # [Q, bq, Hv], [Q, bq]
  return d_out.reshape(-1, v.shape[-1]), d_lse.reshape(-1)


def _accumulate_bias(d_bias, d_logits, i, j, g: Blocks):
  """Adds block (i, j) of dS into d_bias [T' or 1, S' or 1], summing where bias broadcasts."""
  summed = tuple(axis for axis in range(2) if d_bias.shape[axis] == 1)
  block = jnp.sum(d_logits, axis=summed, keepdims=True) if summed else d_logits
  start = [i * g.block_q if d_bias.shape[0] != 1 else 0,
           j * g.block_k if d_bias.shape[1] != 1 else 0]
  start = [jnp.asarray(index, jnp.int32) for index in start]
  current = lax.dynamic_slice(d_bias, start, block.shape)
  return lax.dynamic_update_slice(d_bias, current + block.astype(d_bias.dtype), start)


def _pick(array, index):
  """array[index] along axis 0, or array[0] when that axis broadcasts (size 1); None stays."""
  if array is None:
    return None
  return lax.dynamic_index_in_dim(array, index if array.shape[0] > 1 else 0, 0, keepdims=False)


def _group_inputs(bias, mask, extras: _Extras, mods: Mods, b, n):
  """The _Head of example b and query head n."""
  return _Head(_pick(_pick(bias, b), n), _pick(_pick(mask, b), n),
               *(_pick(per_example, b) for per_example in extras),
               batch=jnp.asarray(b, jnp.int32), head=jnp.asarray(n, jnp.int32),
               sink=_pick(mods.sinks, n), block_kinds=_pick(_pick(mods.block_kinds, b), n),
               score_consts=mods.score_consts, mask_consts=mods.mask_consts,
               anchor=mods.anchor, dropout_key=_pick(_pick(mods.dropout_keys, b), n))


def _map_heads(f, per_query_head, per_kv_head, geometry):
  """lax.map of f(b, n, *arrays of query head n, *arrays of its key/value head) over the B * N
  pairs, ``geometry.pairs_per_step`` side by side (with grouped queries, the key/value head's
  arrays [B, K, ...] by index)."""
  batch, num_heads = per_query_head[0].shape[:2]
  group = num_heads // per_kv_head[0].shape[1]
  by_pair = lambda x: x.reshape((-1,) + x.shape[2:])  # [B, N, ...] -> [B * N, ...]

  def one_head(xs):
    index, arrays, kv = xs
    b, n = index // num_heads, index % num_heads
    if kv is None:
      kv = tuple(_pick(_pick(x, b), n // group) for x in per_kv_head)
    return f(b, n, *arrays, *kv)

  xs = (jnp.arange(batch * num_heads), tuple(map(by_pair, per_query_head)),
        tuple(map(by_pair, per_kv_head)) if group == 1 else None)
  return lax.map(one_head, xs, batch_size=geometry.pairs_per_step)


def forward(q, k, v, bias, mask, extras, mods, pattern, geometry):
  """q [B, N, Tp, H], k [B, K, Sp, H], v [B, K, Sp, Hv] -> out [B, N, Tp, Hv] (compute dtype),
  lse [B, N, Tp] (and each row's largest logit [B, N, Tp] with ``pattern.max_scores``)."""
  def one_head(b, n, q_n, k_n, v_n):
    return _forward_head(q_n, k_n, v_n, _group_inputs(bias, mask, extras, mods, b, n), pattern,
                         geometry)

  out, *statistics = _map_heads(one_head, (q,), (k, v), geometry)  # [B * N, Tp(, Hv)]
  return (out.reshape(q.shape[:3] + v.shape[-1:]),) + tuple(
      x.reshape(q.shape[:3]) for x in statistics)


def trainable(mods: Mods | _Head, values=None):
  """The entries of ``values`` (by default the score_mod's constants themselves: a tuple beside
  ``mods.score_consts``) at the constants that get gradients (``mods.is_trainable``)."""
  values = mods.score_consts if values is None else values
  return tuple(x for c, x in zip(mods.score_consts, values) if mods_lib.is_trainable(c))


def with_trained(consts, trained) -> tuple:
  """``consts`` with its trainable entries replaced, in order, by ``trained``."""
  trained = iter(trained)
  return tuple(next(trained) if mods_lib.is_trainable(c) else c for c in consts)


def tangent(q, k, v, bias, mask, extras, mods, pattern, geometry, out, lse, d_q, d_k, d_v,
            d_bias, d_mods: Mods):
  """The tangents of ``forward``'s out [B, N, Tp, Hv] and lse [B, N, Tp] (``_tangent_head``),
  from those of q, k, v, bias (None without one) and, in ``d_mods``, of the score_mod's
  trainable constants and the sinks; out and lse are the forward's."""
  def one_head(b, n, q_n, out_n, lse_n, d_q_n, k_n, v_n, d_k_n, d_v_n):
    return _tangent_head(q_n, k_n, v_n, out_n, lse_n, d_q_n, d_k_n, d_v_n,
                         _group_inputs(bias, mask, extras, mods, b, n),
                         _group_inputs(d_bias, mask, extras, d_mods, b, n), pattern, geometry)

  d_out, d_lse = _map_heads(one_head, (q, out, lse, d_q), (k, v, d_k, d_v), geometry)
  return (d_out.reshape(out.shape).astype(out.dtype),  # [B, N, Tp, Hv]
          d_lse.reshape(lse.shape).astype(lse.dtype))  # [B, N, Tp]


def backward(q, k, v, bias, mask, extras, mods, pattern, geometry, out, lse, d_out, d_lse=None):
  """Gradients for q, k, v, bias and the score_mod's trainable constants (compute dtype), from
  the cotangents of out and (where given) of the log-sum-exp:
  several query heads side by side where ``geometry.pairs_per_step`` allows, there is no bias
  and any trained constants' gradients of all pairs fit in blocks.PAIR_BLOCK_BYTES (outside
  shard_map), else one key/value head at a time, its G query heads in turn."""
  batch, num_heads, num_kv = q.shape[0], q.shape[1], k.shape[1]
  group = num_heads // num_kv
  dtype = reference.compute_dtype(q.dtype)
  # The products run in the compute dtype (float32 for 16-bit inputs): dS rounded to bfloat16
  # cost dQ a third more error than jax.nn's.
  q, k, v, out, d_out = (x.astype(dtype) for x in (q, k, v, out, d_out))
  # Under shard_map: a block's gradient of a trained constant stays on its device, summed once
  # by the caller (mods_cotangent), not by a collective per block (mods.evaluate).
  mods = mods._replace(score_consts=mods_lib.vary_over(mods.score_consts, mods.anchor))
  trained = trainable(mods)
  like = (q, k, v, d_out, bias, mask, extras, mods)

  def one_kv_head(carry, index):
    d_bias, d_mod = carry
    b, h = index // num_kv, index % num_kv
    kv = lambda x: _pick(_pick(x, b), h)  # [Sp, .]

    def one_query_head(carry, g):
      d_k, d_v, d_bias, d_mod = carry
      n = h * group + g
      head = _group_inputs(bias, mask, extras, mods, b, n)
      q_head = lambda x: _pick(_pick(x, b), n)
      bias_slot = None if d_bias is None else _pick(_pick(d_bias, b), n)
      d_q, d_k_n, d_v_n, bias_slot, d_mod = _backward_head(
          q_head(q), kv(k), kv(v), q_head(out), q_head(lse), q_head(d_out), head, pattern,
          geometry, bias_slot, d_mod, None if d_lse is None else q_head(d_lse))
      if d_bias is not None:
        d_bias = _put_bias(d_bias, bias_slot, b, n)
      return (d_k + d_k_n, d_v + d_v_n, d_bias, d_mod), d_q

    init = (varying_zeros(k.shape[2:], dtype, *like), varying_zeros(v.shape[2:], dtype, *like),
            d_bias, d_mod)
    (d_k, d_v, d_bias, d_mod), d_q = lax.scan(one_query_head, init, jnp.arange(group))
    return (d_bias, d_mod), (d_q, d_k, d_v)  # d_q [G, Tp, H]

  stacked_bytes = 4 * batch * num_heads * sum(c.size for c in trained)  # d_mod of every pair
  # Under shard_map a trained constant's gradient passes a psum inside the heads' vmap, which
  # jax 0.8 cannot batch: one head at a time there.
  small_constants = not trained or (stacked_bytes <= blocks.PAIR_BLOCK_BYTES
                                    and not mods_lib.varying_axes(q))
  if bias is None and geometry.pairs_per_step and small_constants:
    # Nothing large carried from head to head: several query heads side by side; the gradients
    # of a key/value head (and the score_mod's constants) summed over its query heads after.
    def one_head(b, n, q_n, out_n, lse_n, d_out_n, *rest):
      *d_lse_n, k_n, v_n = rest  # the log-sum-exp's cotangent where given
      d_q, d_k, d_v, _, d_mod = _backward_head(
          q_n, k_n, v_n, out_n, lse_n, d_out_n, _group_inputs(bias, mask, extras, mods, b, n),
          pattern, geometry, None, mod_gradient_zeros(mods, dtype),
          *d_lse_n)
      return d_q, d_k, d_v, d_mod

    per_query_head = (q, out, lse, d_out) + (() if d_lse is None else (d_lse,))
    d_q, d_k, d_v, d_mod = _map_heads(one_head, per_query_head, (k, v),
                                      geometry)  # [B * N, L, .], d_mod [B * N, ...]
    per_kv_head = lambda x: jnp.sum(x.reshape((batch, num_kv, group) + x.shape[1:]), axis=2)
    return (d_q.reshape(q.shape), per_kv_head(d_k), per_kv_head(d_v), None,
            tuple(jnp.sum(x, axis=0) for x in d_mod))
  d_bias = None if bias is None else varying_zeros(bias.shape, dtype, *like)
  d_mod = mod_gradient_zeros(mods, dtype)
  (d_bias, d_mod), (d_q, d_k, d_v) = lax.scan(one_kv_head, (d_bias, d_mod),
                                              jnp.arange(batch * num_kv))
  return d_q.reshape(q.shape), d_k.reshape(k.shape), d_v.reshape(v.shape), d_bias, d_mod


def mod_gradient_zeros(mods: Mods, dtype):
  """Zeros for the gradients of the score_mod's trainable constants (a tuple), each varying
  over the shard_map axes its constant and the mods' anchor vary over, as the backward's
  constants do (``backward``), so that every block's gradient adds to them as it is."""
  return tuple(varying_zeros(c.shape, jnp.promote_types(c.dtype, dtype), c, mods.anchor)
               for c in trainable(mods))


def mods_cotangent(mods: Mods, d_mod, d_sinks=None) -> Mods:
  """The cotangent of ``mods`` from the trainable constants' gradients ``d_mod`` (a tuple, as
  ``_backward`` returns them) and the sinks' (or None)."""
  d_mod = iter(d_mod)
  d_score_consts = tuple(_cotangent_like(next(d_mod), c) if mods_lib.is_trainable(c) else None
                         for c in mods.score_consts)
  return Mods(d_score_consts, (None,) * len(mods.mask_consts),
              None if d_sinks is None else _cotangent_like(d_sinks, mods.sinks))


def _put_bias(d_bias, slot, b, n):
  """Writes the [T', S'] gradient ``slot`` back at (b, n) of d_bias [B', N', T', S'] (index 0
  of an axis that broadcasts, where the gradients of all examples or heads add up)."""
  start = [jnp.asarray(index, jnp.int32) for index in
           (b if d_bias.shape[0] > 1 else 0, n if d_bias.shape[1] > 1 else 0, 0, 0)]
  return lax.dynamic_update_slice(d_bias, slot[None, None].astype(d_bias.dtype), start)


def _sinks_gradient(sinks, lse, out, d_out, d_lse=None):
  """d sink_n = -sum over rows of p_sink * (rowsum(dO * O) - d_lse), p_sink = exp(sink_n - lse):
  the sink's share of each row, taken from every key's weight (d out / d sink = -p_sink * out,
  d lse / d sink = p_sink). lse, out, d_out and d_lse [B, N, Tp(, Hv)] -> [N]."""
  delta = jnp.sum(d_out.astype(lse.dtype) * out.astype(lse.dtype), axis=-1)  # [B, N, Tp]
  delta = delta if d_lse is None else delta - d_lse.astype(lse.dtype)
  p_sink = jnp.exp(sinks.astype(lse.dtype)[:, None] - lse)  # [B, N, Tp]
  return -jnp.sum(p_sink * delta, axis=(0, 2)).astype(sinks.dtype)


def _cotangent_like(gradient, primal):
  """``gradient`` in the dtype of ``primal``, summed over the shard_map axes it varies over and
  ``primal`` does not (a table or sinks replicated over the shards that use them)."""
  extra = tuple(sorted(mods_lib.varying_axes(gradient) - mods_lib.varying_axes(primal)))
  gradient = lax.psum(gradient, extra) if extra else gradient
  return gradient.astype(primal.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(7, 8))
def blockwise(q, k, v, bias, mask, extras, mods, pattern, geometry):
  # q is in the compute dtype (prepare), so out is too: the backward's rowsum(dO * O) reads O
  # unrounded, and finish() casts it to the caller's dtype.
  return forward(q, k, v, bias, mask, extras, mods, pattern, geometry)


@blockwise.defjvp
def _blockwise_jvp(pattern, geometry, primals, tangents):
  """The tangents of out and lse by ``_Derivatives.tangent``, a primitive that transposes to the
  backward pass (attention_jax.tangent): jvp runs the tangent kernel, grad the backward kernel,
  and second order differentiates one of them in the inputs (``_Derivatives.derive``). The
  outputs come from ``blockwise`` itself, so that their derivatives are this rule again. Row
  maxima get zero tangents (``finish`` returns them, and the log-sum-exp, under stop_gradient)."""
  q, k, v, bias, mask, extras, mods = primals
  d_q, d_k, d_v, d_bias, _, _, d_mods = tangents
  outputs = blockwise(q, k, v, bias, mask, extras, mods, pattern, geometry)
  derivatives = _Derivatives(pattern, geometry)
  point = (q, k, v, bias, trainable(mods), mods.sinks)
  d_point = (d_q, d_k, d_v, None if bias is None else d_bias,
             trainable(mods, d_mods.score_consts), None if mods.sinks is None else d_mods.sinks)
  d_out, d_lse = tangent_lib.linear(
      derivatives.tangent, derivatives.cotangent, (point, (mask, extras, mods, *outputs[:2])),
      d_point, like=outputs[:2], derive=derivatives.derive)
  return outputs, (d_out, d_lse) + tuple(jnp.zeros_like(x) for x in outputs[2:])


@dataclasses.dataclass(frozen=True)
class _Derivatives:
  """The kernel's tangent (forward mode) and its transpose, the backward pass (reverse mode),
  for one pattern and geometry (bound methods of equal instances are equal: primitive params).
  residuals: the point (q, k, v, bias or None, the score_mod's trainable constants, sinks or
  None), whose tangents and cotangents these are, and (mask, extras, mods, out, lse)."""
  pattern: Pattern
  geometry: Blocks

  @staticmethod
  def _inputs(point, other):
    """(q, k, v, bias, mask, extras, mods) with the point's constants and sinks in mods."""
    q, k, v, bias, trained, sinks = point
    mask, extras, mods = other[:3]
    return q, k, v, bias, mask, extras, mods._replace(
        score_consts=with_trained(mods.score_consts, trained), sinks=sinks)

  def derive(self, point, other):
    """``other`` with out and lse recomputed at ``point`` (second order differentiates this)."""
    out, lse = forward(*self._inputs(point, other), self.pattern, self.geometry)[:2]
    return other[:3] + (out, lse)

  def tangent(self, residuals, tangents):
    out, lse = residuals[1][3:]
    d_q, d_k, d_v, d_bias, d_trained, d_sinks = tangents
    inputs = self._inputs(*residuals)
    d_mods = inputs[-1]._replace(sinks=d_sinks,
                                 score_consts=with_trained(inputs[-1].score_consts, d_trained))
    return tangent(*inputs, self.pattern, self.geometry, out, lse, d_q, d_k, d_v, d_bias, d_mods)

  def cotangent(self, residuals, cotangents):
    q, k, v, bias, mask, extras, mods = self._inputs(*residuals)
    out, lse = residuals[1][3:]
    d_out, d_lse = cotangents
    d_q, d_k, d_v, d_bias, d_mod = backward(q, k, v, bias, mask, extras, mods, self.pattern,
                                             self.geometry, out, lse, d_out, d_lse)
    d_sinks = None if mods.sinks is None else _sinks_gradient(mods.sinks, lse, out, d_out, d_lse)
    d_mods = mods_cotangent(mods, d_mod, d_sinks)  # summed over the shard_map axes they vary over
    d_bias = None if d_bias is None else _cotangent_like(d_bias, bias)
    return d_q, d_k, d_v, d_bias, trainable(mods, d_mods.score_consts), d_mods.sinks


def chunked_attention(query, key, value, bias=None, mask=None, *, scale: float,
                      is_causal: bool = False, local_window_size=None,
                      logits_soft_cap: float | None = None, query_segment_ids=None,
                      key_segment_ids=None, query_seq_lengths=None, key_value_seq_lengths=None,
                      return_residual: bool = False, block_q: int | None = None,
                      block_k: int | None = None, score_mod=None,
                      mask_mod=None, block_mask=None, sinks=None, normalizer: str = "softmax",
                      sigmoid_bias: float | None = None, dropout_rate: float = 0.0,
                      dropout_rng=None, broadcast_dropout: bool = True,
                      return_max_scores: bool = False, empty_rows: str = "mean"):
  """Memory-efficient attention, blockwise in both directions; validated arguments as
  ``dot_product_attention``'s; a query row with no key gives what ``empty_rows`` asks
  (``masks.EMPTY_ROWS``: "mean", jax.nn's answer, by default; or "zero"). Blocks of ``block_q``
  queries and ``block_k`` keys (default: equal blocks, a multiple of 8, of at most
  blocks.DEFAULT_BLOCK_Q and blocks.DEFAULT_BLOCK_K, or DEFAULT_BLOCK_K_CAUSAL under a causal
  mask or with segment ids; under a window, square ones of about half its width,
  ``blocks.Geometry.create``; a ``block_mask``'s own). Dropout on the weights, ``dropout_rate``
  > 0 with ``dropout_rng``: each weight kept with probability 1 - rate and divided by it, by a
  counter-based mask regenerated from (key, example, head, query, key position) in each block,
  forward and backward (memory stays linear in T); with ``broadcast_dropout`` one mask for every
  example and head. The masks differ from flax's (``bernoulli(rng, 1 - rate, shape)``), which
  the reference path draws.

  >>> q = k = v = jnp.ones((2, 512, 4, 64))  # [B, T, N, H]
  >>> chunked_attention(q, k, v, scale=0.125, is_causal=True, block_q=256, block_k=256).shape
  (2, 512, 4, 64)
  """
  # with sinks a row always has the sink; sigmoid attention weighs each key on its own (an
  # empty row is zeros by definition): "mean" applies to softmax rows only
  structure = () if sinks is not None or normalizer != "softmax" else (
      mask, local_window_size, key_value_seq_lengths, query_segment_ids, mask_mod, block_mask)
  return masks_lib.blockwise_empty_rows(
      lambda residual: _chunked_attention(
          query, key, value, bias, mask, scale=scale, is_causal=is_causal,
          local_window_size=local_window_size, logits_soft_cap=logits_soft_cap,
          query_segment_ids=query_segment_ids, key_segment_ids=key_segment_ids,
          query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
          return_residual=residual, block_q=block_q, block_k=block_k, score_mod=score_mod,
          mask_mod=mask_mod, block_mask=block_mask, sinks=sinks, normalizer=normalizer,
          sigmoid_bias=sigmoid_bias, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
          broadcast_dropout=broadcast_dropout, return_max_scores=return_max_scores),
      value, empty_rows, return_residual=return_residual, structure=structure,
      query_seq_lengths=query_seq_lengths)


def _chunked_attention(query, key, value, bias, mask, *, scale, is_causal, local_window_size,
                       logits_soft_cap, query_segment_ids, key_segment_ids, query_seq_lengths,
                       key_value_seq_lengths, return_residual, block_q, block_k, score_mod,
                       mask_mod, block_mask, sinks, normalizer, sigmoid_bias, dropout_rate,
                       dropout_rng, broadcast_dropout, return_max_scores):
  """``chunked_attention`` with zeros on a row with no key."""
  if block_mask is not None:
    block_q, block_k = block_mask.block_q, block_mask.block_k
    mask_mod = block_mask.mask_mod if mask_mod is None else mask_mod
  score, allow, mods = trace_mods(
      score_mod, mask_mod, query, key, value, bias, mask, query_segment_ids, key_segment_ids,
      query_seq_lengths, key_value_seq_lengths, sinks=sinks,
      block_kinds=None if block_mask is None else block_mask.kinds)
  pattern, geometry = plan(query, key, is_causal=is_causal, local_window_size=local_window_size,
                           logits_soft_cap=logits_soft_cap, block_q=block_q, block_k=block_k,
                           score_mod=score, mask_mod=allow, normalizer=normalizer,
                           sigmoid_bias=mods_lib.sigmoid_bias(sigmoid_bias, key.shape[-3]),
                           dropout=dropout_rate > 0.0,
                           segment_ids=query_segment_ids is not None)
  if return_max_scores:
    pattern = dataclasses.replace(pattern, max_scores=True)
  if dropout_rate > 0.0:
    pattern = dataclasses.replace(pattern, dropout_rate=float(dropout_rate))
    mods = mods._replace(dropout_keys=blocks.head_keys(
        dropout_rng, math.prod(query.shape[:-3]), query.shape[-2], broadcast_dropout))
  if block_mask is not None and block_mask.kinds.shape[:2] != (1, 1):
    # block kinds that differ by example or head would make the skip predicates batched (both
    # branches run) where several pairs run side by side
    geometry = dataclasses.replace(geometry, side_by_side=False)
  inputs = prepare(query, key, value, bias, mask, scale=scale, geometry=geometry,
                   segment_ids=(query_segment_ids, key_segment_ids),
                   seq_lengths=(query_seq_lengths, key_value_seq_lengths), mods=mods)
  out, lse, *row_max = blockwise(*inputs, pattern, geometry)  # [B, N, Tp(, H_v)]
  return finish(out, lse, query, return_residual, *row_max)


def trace_mods(score_mod, mask_mod, query, *inputs, sinks=None, block_kinds=None):
  """The score_mod and mask_mod traced (``mods.Mod`` or None), on scalars that vary like the
  call's arrays (``query`` and ``inputs``, None skipped), and the Mods that carry their
  constants, the sinks and the block kinds into the kernel."""
  anchor = None
  if score_mod is not None or mask_mod is not None:
    anchor = mods_lib.anchor_of(query, *inputs, sinks)
  score = mods_lib.trace_score_mod(score_mod, reference.compute_dtype(query.dtype), anchor)
  allow = mods_lib.trace_mask_mod(mask_mod, anchor)
  mods = Mods(() if score is None else score.consts, () if allow is None else allow.consts,
               None if sinks is None else jnp.asarray(sinks), block_kinds, anchor)
  return score, allow, mods


def plan(query, key, *, is_causal=False, local_window_size=None, logits_soft_cap=None,
         block_q=None, block_k=None, narrow_keys=False, score_mod=None, mask_mod=None,
         normalizer="softmax", sigmoid_bias=0.0, dropout=False,
         segment_ids=False) -> tuple[Pattern, Blocks]:
  """The static pattern and block geometry for query [..., T, N, H] and key [..., S, K, H]
  (``narrow_keys``: the default key blocks of causal attention, for a caller that masks by
  positions; otherwise a window's blocks follow its width, ``Blocks.create``'s ``band``;
  ``segment_ids``: given, so that whole blocks of other documents are skipped, the causal key
  blocks too; ``score_mod`` and ``mask_mod``: traced ``mods.Mod`` or None)."""
  pattern = Pattern(bool(is_causal), _checks.local_window(local_window_size),
                    _checks.soft_cap(logits_soft_cap),
                    None if score_mod is None else score_mod.fn,
                    None if mask_mod is None else mask_mod.fn, normalizer, sigmoid_bias)
  band = None
  if pattern.window is not None and not narrow_keys:  # blocks skipped by index: small ones
    before, after = pattern.reach
    band = before + after + 1
  narrow_keys = narrow_keys or pattern.is_causal or pattern.window is not None or segment_ids
  return pattern, Blocks.create(query.shape[-3], key.shape[-3], block_q, block_k, narrow_keys,
                               dropout, band)


class Inputs(NamedTuple):
  """The kernel's inputs: q, k, v head-major and padded to whole blocks, [B, N or K, Lp, H];
  bias and mask [B or 1, N or 1, Tp or 1, Sp or 1]; the per-example _Extras; the Mods."""
  q: jax.Array
  k: jax.Array
  v: jax.Array
  bias: jax.Array | None
  mask: jax.Array | None
  extras: _Extras
  mods: Mods = Mods()


def prepare(query, key, value, bias=None, mask=None, *, scale, geometry: Blocks,
            segment_ids=(None, None), seq_lengths=(None, None), positions=(None, None),
            mods: Mods = Mods()) -> Inputs:
  """Inputs in the layout of the contract ([..., L, N, H]) -> the kernel's Inputs; each pair is
  (for the queries, for the keys), per example [..., L] (segments, positions) or [...] (lengths)
  or shared by all; ``mods`` passes through."""
  batch_shape = query.shape[:-3]
  padded_q, padded_k = geometry.num_q * geometry.block_q, geometry.num_k * geometry.block_k

  def head_major(x, length):  # [..., L, N, H] -> [B, N, L_padded, H]
    return blocks.pad_axis(reference.flat_heads_first(x), 2, length, broadcasts=False)

  # The scale is applied in the compute dtype (float32 for a 16-bit query), as the reference
  # applies it to the logits: a bfloat16 query times 1/sqrt(H) would be rounded again.
  q = head_major(query.astype(reference.compute_dtype(query.dtype)) * scale, padded_q)
  k, v = head_major(key, padded_k), head_major(value, padded_k)

  def pad_logits(x):  # a mask or bias -> [B or 1, N or 1, T_padded or 1, S_padded or 1]
    x = masks_lib.flatten_batch(x, batch_shape)
    return blocks.pad_axis(blocks.pad_axis(x, 2, padded_q), 3, padded_k)

  def per_example(x, length=None):  # [...] or [..., L] -> [B or 1] or [B or 1, L_padded]
    x = None if x is None else jnp.asarray(x, jnp.int32)
    x = masks_lib.flatten_batch(x, batch_shape, core=0 if length is None else 1)
    return x if length is None else blocks.pad_axis(x, 1, length, mode="edge", broadcasts=False)

  extras = _Extras(per_example(segment_ids[0], padded_q), per_example(segment_ids[1], padded_k),
                   per_example(seq_lengths[0]), per_example(seq_lengths[1]),
                   per_example(positions[0], padded_q), per_example(positions[1], padded_k))
  return Inputs(q, k, v, pad_logits(bias), pad_logits(mask), extras, mods)


def finish(out, lse, query, return_residual=False, row_max=None):
  """The kernel's out [B, N, Tp, H_v] and lse [B, N, Tp] (see ``reference.residual_of``) -> out
  [..., T, N, H_v] (and lse [..., T, N], -inf on empty rows, without gradient; then the row
  maxima, the same way, where given) for a query of ``query`` [..., T, N, H], in its dtype."""
  batch_shape, q_len = query.shape[:-3], query.shape[-3]
  out = reference.heads_first(out[:, :, :q_len]).astype(query.dtype)  # [B, T, N, H_v]
  out = jnp.reshape(out, batch_shape + out.shape[1:])

  def per_row(statistic):  # [B, N, Tp] -> [..., T, N]
    statistic = jnp.swapaxes(reference.residual_of(statistic)[:, :, :q_len], 1, 2)
    return lax.stop_gradient(jnp.reshape(statistic, batch_shape + statistic.shape[1:]))
  extras = ((per_row(lse),) if return_residual else ()) + (
      () if row_max is None else (per_row(row_max),))
  return (out, *extras) if extras else out
