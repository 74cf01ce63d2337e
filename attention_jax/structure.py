"""The structure of attention, said once: which (query, key) pairs the causal mask, a window,
lengths, segment ids, a mask and a mask_mod allow, by pairs and by blocks. ``chunked`` asks it
block by block as it walks (context parallelism changes the key positions at each ring step);
``pallas_gpu`` takes the whole of it as one mask_mod and block mask (``translate``).

A block predicate ``meets(q_lo, q_hi, kv_lo, kv_hi)`` of the least and greatest positions (or
ids) of a query block and a key block is true where some pair may attend; at the far corners,
``meets(q_hi, q_lo, kv_hi, kv_lo)``, where every pair may (``kinds``); a pair is a block of one.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from attention_jax import block_masks
from attention_jax import blocks as blocks_lib
from attention_jax import masks as masks_lib


def reach(is_causal: bool, window) -> tuple[int | None, int | None]:
  """(before, after): how far before and after its own position a query's keys may lie, None
  where unbounded; the window's (left, right), with ``after`` at most 0 under the causal mask.

  >>> reach(True, (64, 8)), reach(False, None)
  ((64, 0), (None, None))
  """
  before, after = (None, None) if window is None else window
  if is_causal:
    after = 0 if after is None else min(after, 0)
  return before, after


def band_meets(q_lo, q_hi, kv_lo, kv_hi, reach_):
  """The block predicate of keys within ``reach_`` (before, after) of the query, as parts to be
  and-ed (none when unbounded); of one pair, ``band_meets(q, q, kv, kv, reach_)``.

  >>> [part.tolist() for part in band_meets(5, 5, np.array([2, 5, 6]), np.array([2, 5, 6]), (2, 0))]
  [[True, True, False], [False, True, True]]
  """
  before, after = reach_
  parts = []
  if after is not None:
    parts.append(kv_lo <= (q_hi if after == 0 else q_hi + after))
  if before is not None:
    parts.append(kv_hi >= q_lo - before)
  return parts


def segments_meet(q_lo, q_hi, kv_lo, kv_hi):
  """The block predicate of equal segment ids: the blocks' ranges of ids overlap (all ids equal
  at the far corners)."""
  return (q_lo <= kv_hi) & (kv_lo <= q_hi)


def kinds(meets, q, kv):
  """int8 kinds of the blocks whose query and key positions or ids span ``q`` and ``kv``, each
  (lo, hi) (broadcastable), under the block predicate ``meets``.

  >>> q_ids = (np.array([1, 1, 2]), np.array([1, 2, 2]))  # three query blocks' least, greatest
  >>> kinds(segments_meet, q_ids, (2, 2)).tolist()  # against a key block of document 2
  [0, 1, 2]
  """
  return blocks_lib.block_kind(meets(q[1], q[0], kv[1], kv[0]), meets(q[0], q[1], kv[0], kv[1]))


def _by_block(x, axis: int, block: int):
  """``x`` with ``axis`` (length L) padded by its last entry to whole blocks and split into
  [L / block, block] (a block's any, all, min and max are those of its real entries); an axis
  of size 1 (one that broadcasts) into [1, 1]."""
  x = blocks_lib.pad_axis(x, axis, blocks_lib.round_up(x.shape[axis], block), mode="edge")
  return jnp.reshape(x, x.shape[:axis] + (-1, min(block, x.shape[axis])) + x.shape[axis + 1:])


def _index_ranges(length: int, block: int, keys: bool = False):
  """The first and last index of each block, shaped as ``_ranges`` shapes them (numpy)."""
  first, shape = np.arange(0, length, block), (1, 1, -1) if keys else (1, -1, 1)
  return np.reshape(first, shape), np.reshape(np.minimum(first + block, length) - 1, shape)


def _ranges(ids, block: int, keys: bool = False):
  """Ids or positions [B, L] -> their least and greatest per block, ([B, L / block, 1],) * 2,
  or ``keys`` ([B, 1, L / block],) * 2."""
  ids = _by_block(ids, 1, block)
  return tuple(jnp.expand_dims(reduce(ids, -1), 1 if keys else 2) for reduce in (jnp.min, jnp.max))


def translate(batch_shape, q_len: int, kv_len: int, blocks, *, is_causal: bool = False,
              window=None, mask=None, lengths=(None, None), segment_ids=(None, None),
              mask_mod=None, block_kinds=None):
  """The structure of one call as (mask_mod, None), every structure's mask_mod and-ed, or where
  any one's kinds at ``blocks`` (bq, bk) are known (all but a ``mask_mod`` without
  ``block_kinds``) as (None, their block mask): empty where one is, full where all are, never
  full beside unknown kinds. ``batch_shape``: the query's leading dims (mods see the flattened
  example); ``lengths`` and ``segment_ids``: (for the queries, for the keys).

  >>> mask_mod, block_mask = translate((1,), 64, 64, (16, 16), is_causal=True)
  >>> print(block_mask.to_string())
  every batch and head
  |░   |
  |█░  |
  |██░ |
  |███░|
  """
  block_q, block_k = blocks
  per_example = lambda x, *tail: jnp.reshape(jnp.broadcast_to(x, batch_shape + x.shape[
      x.ndim - len(tail):]), (-1,) + tail)
  q_range = _index_ranges(q_len, block_q)  # ([1, T / bq, 1],) * 2
  kv_range = _index_ranges(kv_len, block_k, keys=True)  # ([1, 1, S / bk],) * 2
  parts = []  # (mask_mod, kinds [B or 1, N' or 1, T / bq or 1, S / bk or 1] or None)
  if (extent := reach(is_causal, window)) != (None, None):
    parts.append((lambda b, h, q_idx, kv_idx: masks_lib.combine_masks(
                      *band_meets(q_idx, q_idx, kv_idx, kv_idx, extent)),
                  kinds(lambda *ranges: masks_lib.combine_masks(*band_meets(*ranges, extent)),
                        q_range, kv_range)[None]))
  if mask_mod is not None:
    parts.append((mask_mod, block_kinds))
  if mask is not None:
    flat_mask = masks_lib.flatten_batch(mask, batch_shape) != 0  # [B or 1, N', T', S']
    allowed = _by_block(_by_block(flat_mask, 3, block_k), 2, block_q)  # [B', N', nq, bq, nk, bk]
    # (a T' or S' of 1, which broadcasts, stays one block of one: the mask is never made T x S)
    flat_mask = flat_mask.astype(jnp.int8)
    parts.append((lambda b, h, q_idx, kv_idx: flat_mask[b, h, q_idx, kv_idx] != 0,
                  blocks_lib.block_kind(jnp.all(allowed, axis=(3, 5)),
                                        jnp.any(allowed, axis=(3, 5)))))
  q_lengths, kv_lengths = (None if x is None else per_example(x) for x in lengths)  # [B]
  if kv_lengths is not None:  # kinds [B, 1, 1, S / bk]
    parts.append((lambda b, h, q_idx, kv_idx: kv_idx < kv_lengths[b],
                  kinds(lambda *ranges: ranges[2] < kv_lengths[:, None, None], q_range,
                        kv_range)[:, None]))
  if q_lengths is not None:  # kinds [B, 1, T / bq, 1]
    parts.append((lambda b, h, q_idx, kv_idx: q_idx < q_lengths[b],
                  kinds(lambda *ranges: ranges[0] < q_lengths[:, None, None], q_range,
                        kv_range)[:, None]))
  if segment_ids[0] is not None:
    q_ids, kv_ids = (per_example(x, x.shape[-1]) for x in segment_ids)  # [B, T], [B, S]
    parts.append((lambda b, h, q_idx, kv_idx: q_ids[b, q_idx] == kv_ids[b, kv_idx],
                  kinds(segments_meet, _ranges(q_ids, block_q),
                        _ranges(kv_ids, block_k, keys=True))[:, None]))
  mods = [mod for mod, _ in parts]
  combined = None if not mods else mods[0] if len(mods) == 1 else (
      lambda *indices: masks_lib.combine_masks(*(mod(*indices) for mod in mods)))
  known = [part_kinds for _, part_kinds in parts if part_kinds is not None]
  if not known:
    return combined, None
  combined_kinds = functools.reduce(jnp.minimum, known)
  if len(known) < len(parts):  # a mask_mod without a block mask: no block is known full
    combined_kinds = jnp.minimum(combined_kinds, blocks_lib.PARTIAL)
  combined_kinds = jnp.broadcast_to(combined_kinds, combined_kinds.shape[:2] + (
      -(-q_len // blocks[0]), -(-kv_len // blocks[1])))
  return None, block_masks.BlockMask(combined_kinds, q_len, kv_len, *blocks, combined)
