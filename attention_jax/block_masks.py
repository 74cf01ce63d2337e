"""Block masks, PyTorch FlexAttention's ``BlockMask``: per block of queries and keys, whether a
mask_mod allows none of its pairs (empty: skipped), all of them (full: the mask_mod is not
evaluated) or some (partial). Made once by ``make_block_mask`` and reused by every layer of the
same shape; indexed by example and head, drawn by ``print``, cut to a shorter length without
calling the mask_mod again, and converted to and from torch's per-row lists of key blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attention_jax import blocks
from attention_jax import mods

#: The block size make_block_mask uses by default, torch's (create_block_mask's BLOCK_SIZE).
DEFAULT_BLOCK_SIZE = 128
_GLYPHS = {blocks.EMPTY: " ", blocks.PARTIAL: "░", blocks.FULL: "█"}  # as torch draws them


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockMask:
  """Which blocks of queries and keys a mask_mod leaves empty, partial or full: a pytree whose
  one array is ``kinds``, int8 [B or 1, N or 1, T / block_q, S / block_k] of ``blocks.EMPTY``,
  ``PARTIAL`` or ``FULL``; made by ``make_block_mask`` for T = q_len and S = kv_len, passed as
  ``block_mask=``.

  Example:
    >>> causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # diagonal blocks partial
    >>> make_block_mask(causal, None, None, 256, 256, block_size=128).kinds[0, 0]
    Array([[1, 0],
           [2, 1]], dtype=int8)
  """
  kinds: jax.Array
  q_len: int = dataclasses.field(metadata=dict(static=True))
  kv_len: int = dataclasses.field(metadata=dict(static=True))
  block_q: int = dataclasses.field(metadata=dict(static=True))
  block_k: int = dataclasses.field(metadata=dict(static=True))
  mask_mod: Callable = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, int, int, int]:
    """The mask's shape, B or 1, N or 1, T and S, as torch's ``BlockMask.shape`` gives it."""
    return (*self.kinds.shape[:2], self.q_len, self.kv_len)

  def sparsity(self) -> jax.Array:
    """The fraction of blocks that are skipped (empty)."""
    return jnp.mean(self.kinds == blocks.EMPTY)

  def __getitem__(self, index) -> BlockMask:
    """The block mask of some examples and heads, ``block_mask[b]`` or ``block_mask[b, h]``
    (ints or slices), as torch indexes one. Unlike torch's, an indexed dimension stays, of size
    1 (it then stands for every example or head of a call), and the mask_mod is re-based to
    answer for the examples and heads chosen, so that the result masks what it shows.

    >>> per_head = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx + 64 * h
    >>> mask = make_block_mask(per_head, None, 2, 128, 128, block_size=64)
    >>> mask[0, 1].kinds[0, 0]  # head 1: keys 64 behind the query
    Array([[0, 0],
           [1, 0]], dtype=int8)
    """
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > 2 or not all(isinstance(i, (int, slice)) for i in index):
      raise ValueError("a BlockMask is indexed by example and head, block_mask[b] or "
                       f"block_mask[b, h] with ints or slices, got {index!r}.")
    kinds, maps = self.kinds, []
    for axis, i in enumerate(index):
      size = kinds.shape[axis]
      if isinstance(i, int):
        if not -size <= i < size:
          raise ValueError(f"index {i} is out of range for the block mask's "
                           f"{('batch', 'heads')[axis]} of {size}.")
        i = slice(i % size, i % size + 1)
      start, stop, step = i.indices(size)
      kinds = lax.slice_in_dim(kinds, start, stop, step, axis=axis)
      maps.append(None if size == 1 or (start, step) == (0, 1) else (start, step))
    if not any(maps):
      return dataclasses.replace(self, kinds=kinds)
    maps += [None] * (2 - len(maps))
    rebase = lambda x, m: x if m is None else m[0] + x * m[1]  # noqa: E731
    user = self.mask_mod
    mask_mod = lambda b, h, q_idx, kv_idx: user(rebase(b, maps[0]), rebase(h, maps[1]),  # noqa: E731
                                                q_idx, kv_idx)
    return dataclasses.replace(self, kinds=kinds, mask_mod=mask_mod)

  def adjust(self, q_len: int, kv_len: int) -> BlockMask:
    """The block mask for shorter lengths T' <= T and S' <= S, cut from this one without calling
    the mask_mod (torch's ``_adjust``): a block that loses its last rows or columns keeps its
    kind, which stays true (full stays full, empty stays empty; a partial block that became
    full or empty is still evaluated, which is right, only slower)."""
    if not (0 < q_len <= self.q_len and 0 < kv_len <= self.kv_len):
      raise ValueError(f"adjust cuts a block mask to shorter lengths; it was made for T="
                       f"{self.q_len}, S={self.kv_len}, asked for T={q_len}, S={kv_len}: make "
                       "a new one with make_block_mask for longer ones.")
    kinds = self.kinds[:, :, :blocks.round_up(q_len, self.block_q) // self.block_q,
                       :blocks.round_up(kv_len, self.block_k) // self.block_k]
    return dataclasses.replace(self, kinds=kinds, q_len=q_len, kv_len=kv_len)

  def as_kv_blocks(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """torch's per-row lists of key blocks: (kv_num_blocks [B, N, T / bq], kv_indices
    [B, N, T / bq, S / bk]) of the partial blocks and (full_kv_num_blocks, full_kv_indices) of
    the full ones, int32, each row's listed blocks first in ascending order."""

    def ordered(selected):  # [..., K] bool -> (count [...], indices [..., K])
      order = jnp.argsort(~selected, axis=-1, stable=True)
      return jnp.sum(selected, -1, dtype=jnp.int32), order.astype(jnp.int32)
    return (*ordered(self.kinds == blocks.PARTIAL), *ordered(self.kinds == blocks.FULL))

  @classmethod
  def from_kv_blocks(cls, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                     full_kv_indices=None, block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
                     mask_mod: Callable | None = None,
                     seq_lengths: tuple[int, int] | None = None) -> BlockMask:
    """A block mask from torch's per-row lists of key blocks (``as_kv_blocks``; torch's
    ``BlockMask.from_kv_blocks``): the first kv_num_blocks entries of each row of kv_indices
    are partial blocks (evaluated with ``mask_mod``, default ``noop_mask``), those of the full
    lists full, every other block empty. ``seq_lengths``: (T, S), default whole blocks."""
    kv_num_blocks, kv_indices = jnp.asarray(kv_num_blocks), jnp.asarray(kv_indices)
    if kv_indices.ndim != 4 or kv_num_blocks.shape != kv_indices.shape[:3]:
      raise ValueError("from_kv_blocks takes kv_num_blocks [B, N, T / bq] and kv_indices "
                       f"[B, N, T / bq, S / bk], got {kv_num_blocks.shape} and "
                       f"{kv_indices.shape}.")
    block_q, block_k = (block_size, block_size) if isinstance(block_size, int) else block_size
    num_q, num_k = kv_indices.shape[2:]
    q_len, kv_len = seq_lengths or (num_q * block_q, num_k * block_k)

    def listed(count, indices):  # -> [B, N, T / bq, S / bk] bool
      slots = jnp.arange(indices.shape[-1]) < jnp.asarray(count)[..., None]
      hits = jax.nn.one_hot(indices, num_k, dtype=jnp.bool_) & slots[..., None]
      return jnp.any(hits, axis=-2)
    full = (jnp.zeros(kv_indices.shape, jnp.bool_) if full_kv_num_blocks is None
            else listed(full_kv_num_blocks, jnp.asarray(full_kv_indices)))
    kinds = blocks.block_kind(full, full | listed(kv_num_blocks, kv_indices))
    return cls(kinds, q_len, kv_len, block_q, block_k, mask_mod or mods.noop_mask)

  def to_string(self, grid_size: tuple[int, int] = (20, 20), limit: int = 4) -> str:
    """The block grid of the first ``limit`` (example, head) pairs, each at most ``grid_size``
    characters (rows, columns): "█" full, "░" partial, " " empty; a character that stands for
    several blocks is full or empty only where all of them are."""
    if isinstance(self.kinds, jax.core.Tracer):
      return "(the blocks are traced: print the block mask outside jit)"
    kinds = np.asarray(self.kinds)
    num_rows, num_columns = min(grid_size[0], kinds.shape[2]), min(grid_size[1], kinds.shape[3])
    pictures = []
    for b, h in list(np.ndindex(*kinds.shape[:2]))[:limit]:
      rows = ("|" + "".join(map(_glyph, np.array_split(row, num_columns, axis=1))) + "|"
              for row in np.array_split(kinds[b, h], num_rows))
      label = f"batch {b}, head {h}" if kinds.shape[:2] != (1, 1) else "every batch and head"
      pictures.append(label + "\n" + "\n".join(rows))
    if kinds.shape[0] * kinds.shape[1] > limit:
      pictures.append(f"... {kinds.shape[0] * kinds.shape[1] - limit} more")
    return "\n".join(pictures)

  def __repr__(self) -> str:
    sparsity = ("" if isinstance(self.kinds, jax.core.Tracer)
                else f", sparsity={100 * float(self.sparsity()):.2f}%")
    return (f"BlockMask(shape={self.shape}, block_size=({self.block_q}, {self.block_k})"
            f"{sparsity},\n{self.to_string()}\n)")


def _glyph(cell: np.ndarray) -> str:
  """The character of a group of blocks: their kind where they share one, else partial."""
  kinds = np.unique(cell)
  return _GLYPHS[int(kinds[0]) if len(kinds) == 1 else blocks.PARTIAL]


def make_block_mask(mask_mod, batch: int | None, heads: int | None, q_len: int, kv_len: int,
                    *, block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE) -> BlockMask:
  """The BlockMask of ``mask_mod`` over T x S (torch's create_block_mask), evaluated one block
  row at a time (memory linear in the lengths). ``batch`` (B) and ``heads`` (N): None where the
  mask is the same for all; ``block_size``: an int or (block_q, block_k), rounded as the
  blockwise kernel rounds its blocks.

  Example:
    >>> docs = jnp.repeat(jnp.arange(4), 64)  # 4 documents of 64 tokens
    >>> same_doc = lambda b, h, q_idx, kv_idx: docs[q_idx] == docs[kv_idx]
    >>> mask = make_block_mask(same_doc, None, None, 256, 256, block_size=64)
    >>> float(mask.sparsity())
    0.75
  """
  mod = mods.trace_mask_mod(mask_mod)
  block_q, block_k = blocks.block_sizes(q_len, kv_len, block_size)
  num_q, num_k = -(-q_len // block_q), -(-kv_len // block_k)
  batch_size, num_heads = batch or 1, heads or 1
  kv_idx = jnp.arange(num_k * block_k, dtype=jnp.int32)  # [Sp]

  def block_row(index):  # one (example, head, query block) -> kinds [num_k]
    b, h, i = index // (num_heads * num_q), index // num_q % num_heads, index % num_q
    q_idx = i * block_q + jnp.arange(block_q, dtype=jnp.int32)  # [bq]
    # padding repeats the last real query and key, which changes no block's minimum or maximum
    allowed = mod(b, h, jnp.minimum(q_idx, q_len - 1)[:, None],
                  jnp.minimum(kv_idx, kv_len - 1)[None, :])  # [bq, Sp]
    # a block is full where all its pairs are allowed, empty where none is: the minimum and
    # the maximum over int8 (several times faster than a count on a CPU)
    allowed = jnp.reshape(allowed.astype(jnp.int8), (block_q, num_k, block_k))
    return blocks.block_kind(jnp.min(allowed, axis=(0, 2)) == 1,
                             jnp.max(allowed, axis=(0, 2)) == 1)

  kinds = lax.map(block_row, jnp.arange(batch_size * num_heads * num_q, dtype=jnp.int32))
  kinds = jnp.reshape(kinds, (batch_size, num_heads, num_q, num_k))
  return BlockMask(kinds, q_len, kv_len, block_q, block_k, mask_mod)


def check_block_mask(block_mask, mask_mod, batch_size: int, num_heads: int, q_len: int,
                     kv_len: int):
  """The mask_mod a call runs (its own, or the block mask's), after checking that the block mask
  was made for this call."""
  if block_mask is None:
    return mask_mod
  if not isinstance(block_mask, BlockMask):
    raise ValueError(f"block_mask must be a BlockMask from make_block_mask, got "
                     f"{type(block_mask).__name__}.")
  if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
    raise ValueError(f"block_mask was made for q_len={block_mask.q_len}, kv_len="
                     f"{block_mask.kv_len}, but this call has T={q_len}, S={kv_len}; make it "
                     f"with make_block_mask(mask_mod, B, N, {q_len}, {kv_len}).")
  b, n = block_mask.kinds.shape[:2]
  if b not in (1, batch_size) or n not in (1, num_heads):
    raise ValueError(f"block_mask was made for batch={b}, heads={n}, but this call has "
                     f"batch={batch_size} (flattened), heads={num_heads}; make it with those "
                     "or None.")
  if mask_mod is not None and mask_mod is not block_mask.mask_mod:
    raise ValueError("mask_mod differs from the one block_mask was made from; pass only "
                     "block_mask= (it carries its mask_mod), or make it from this mask_mod.")
  return block_mask.mask_mod
