"""Custom attention as functions, with PyTorch FlexAttention's conventions.

``score_mod(score, batch, head, q_idx, kv_idx) -> score`` changes one scaled logit;
``mask_mod(batch, head, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` attends to key
``kv_idx``. Both are written for scalars (int32 indices, as in torch) and applied to every entry
of a block at once (``jax.vmap``). Arrays a mod closes over are hoisted out of it (its jaxpr's
constants), so that they can enter a custom VJP as inputs and receive gradients: a learnable bias
table trains.

A ``BlockMask`` (from ``make_block_mask``) records, per block of queries and keys, whether the
mask_mod allows none of its pairs (empty: skipped), all of them (full: mask_mod not evaluated)
or some (partial). It is computed once and reused by every layer of the same shape.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attention_jax import blocks
from attention_jax import reference

#: The block size make_block_mask uses by default, torch's (create_block_mask's BLOCK_SIZE).
DEFAULT_BLOCK_SIZE = 128


@dataclasses.dataclass(frozen=True, eq=False)
class Mod:
  """A score_mod or mask_mod (``user``), and the same traced once at scalars: ``fn(consts,
  *scalars)`` with the arrays it closed over as explicit ``consts`` (for a custom VJP, which
  must see them as inputs to differentiate them), its scalar inputs varying over the shard_map
  axes of ``anchor`` (``vary_like``)."""
  user: Callable
  fn: Callable
  consts: tuple
  anchor: jax.Array | None = None
  jaxpr: jax.core.Jaxpr | None = None  # fn's, for kernels that evaluate it themselves

  def __call__(self, *arrays):
    """The mod on every entry of broadcast arrays (the score first, for a score_mod; then the
    batch, head, query and key indices), calling the user's function."""
    return pointwise(lambda consts, *scalars: self.user(*scalars), (), *arrays)


def pointwise(fn, consts, *arrays, anchor=None):
  """``fn(consts, *scalars)`` on every entry of the broadcast ``arrays``: one output per entry, in
  their broadcast shape (made to vary like ``anchor`` first, as ``fn`` was traced). A scalar
  among them (a block's batch or head index) enters once, not once per entry, so that a
  constant it indexes (``slopes[h]``) is read, and its gradient added, once per call: the
  entry-wise gather's transpose is a scatter of every entry onto one address, which a GPU
  serialises."""
  arrays = [vary_like(jnp.asarray(array), anchor) for array in arrays]
  if not any(array.ndim for array in arrays):
    return fn(tuple(consts), *arrays)
  shape = jnp.broadcast_shapes(*(array.shape for array in arrays))
  flat = [jnp.reshape(jnp.broadcast_to(array, shape), (-1,)) if array.ndim else array
          for array in arrays]
  axes = tuple(0 if array.ndim else None for array in arrays)
  out = jax.vmap(fn, in_axes=(None,) + axes)(tuple(consts), *flat)
  return jnp.reshape(out, shape)


def vary_like(array, anchor):
  """``array``, varying over the shard_map axes that ``anchor`` (a scalar) varies over, at
  least: the identity outside shard_map, which XLA drops. A mod's jaxpr, traced on scalars
  that vary like the call's inputs, binds its primitives directly, so its operands must vary
  as they did then."""
  return array if anchor is None else jnp.where(anchor == 0, array, array)


def anchor_of(*arrays):
  """An int32 zero that varies over every shard_map axis any of ``arrays`` (None skipped)
  varies over."""
  leaves = jax.tree_util.tree_leaves(arrays)
  return sum((jnp.zeros_like(leaf, jnp.int32, shape=()) for leaf in leaves),
             jnp.zeros((), jnp.int32))


def is_trainable(const) -> bool:
  """Whether a constant a score_mod closed over gets a gradient (a floating array)."""
  return jnp.issubdtype(jnp.result_type(const), jnp.floating)


def _trace(mod, name, examples, want, anchor):
  """``mod`` traced at scalar ``examples`` into a Mod; ``want`` checks its output's dtype."""
  if not callable(mod):
    raise ValueError(f"{name} must be a function, got {mod!r}.")
  try:
    closed = jax.make_jaxpr(mod)(*examples)
  except TypeError as error:
    raise ValueError(f"{name} must take {len(examples)} arguments ({_SIGNATURES[name]}): "
                     f"{error}") from None
  (out,) = closed.out_avals if len(closed.out_avals) == 1 else (None,)
  if out is None or out.shape != () or not want(out.dtype):
    got = "several outputs" if out is None else f"{out.dtype}{list(out.shape)}"
    raise ValueError(f"{name} must return {_RETURNS[name]} for scalar arguments "
                     f"({_SIGNATURES[name]}), got {got}.")
  jaxpr = closed.jaxpr

  def fn(consts, *scalars):
    return jax.core.eval_jaxpr(jaxpr, consts, *scalars)[0]
  return Mod(mod, fn, tuple(closed.consts), anchor, jaxpr)


_SIGNATURES = {"score_mod": "score, batch, head, q_idx, kv_idx",
               "mask_mod": "batch, head, q_idx, kv_idx"}
_RETURNS = {"score_mod": "one floating score (a scalar like its score)",
            "mask_mod": "one bool (a scalar)"}


def trace_score_mod(score_mod, dtype=jnp.float32, anchor=None) -> Mod | None:
  """score_mod(score, batch, head, q_idx, kv_idx) -> score as a Mod (None stays None), traced
  on scalars that vary like ``anchor`` (``anchor_of`` the call's inputs)."""
  if score_mod is None:
    return None
  index = vary_like(jnp.zeros((), jnp.int32), anchor)
  examples = (vary_like(jnp.zeros((), dtype), anchor),) + (index,) * 4
  return _trace(score_mod, "score_mod", examples, lambda d: jnp.issubdtype(d, jnp.floating),
                anchor)


def trace_mask_mod(mask_mod, anchor=None) -> Mod | None:
  """mask_mod(batch, head, q_idx, kv_idx) -> bool as a Mod (None stays None)."""
  if mask_mod is None:
    return None
  index = vary_like(jnp.zeros((), jnp.int32), anchor)
  return _trace(mask_mod, "mask_mod", (index,) * 4, lambda d: d == jnp.bool_, anchor)


def dense_indices(batch_shape, num_heads, q_len, kv_len):
  """The batch, head, query and key indices, broadcastable to [..., N, T, S] (batch: the
  flattened index over ``batch_shape``)."""
  batch = jnp.reshape(jnp.arange(math.prod(batch_shape), dtype=jnp.int32),
                      tuple(batch_shape) + (1, 1, 1))
  head = jnp.arange(num_heads, dtype=jnp.int32)[:, None, None]  # [N, 1, 1]
  q_idx = jnp.arange(q_len, dtype=jnp.int32)[:, None]  # [T, 1]
  kv_idx = jnp.arange(kv_len, dtype=jnp.int32)  # [S]
  return batch, head, q_idx, kv_idx


def dense(score_mod, mask_mod, dtype, batch_shape, num_heads: int, q_len: int, kv_len: int):
  """The mods on every entry of [..., N, T, S] at once, as the dense implementations apply them:
  (the score_mod as a function of the logits, or None; the mask_mod's boolean mask, or None).
  ``dtype``: the query's (the score_mod is traced in its compute dtype)."""
  if score_mod is None and mask_mod is None:
    return None, None
  indices = dense_indices(batch_shape, num_heads, q_len, kv_len)
  score = trace_score_mod(score_mod, reference.compute_dtype(dtype))
  allow = trace_mask_mod(mask_mod)
  return (None if score is None else lambda logits: score(logits, *indices),
          None if allow is None else allow(*indices))


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

  def sparsity(self) -> jax.Array:
    """The fraction of blocks that are skipped (empty)."""
    return jnp.mean(self.kinds == blocks.EMPTY)


jax.tree_util.register_dataclass(BlockMask, data_fields=["kinds"],
                                 meta_fields=["q_len", "kv_len", "block_q", "block_k",
                                              "mask_mod"])


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
  mod = trace_mask_mod(mask_mod)
  block_q, block_k = blocks.block_sizes(q_len, kv_len, block_size)
  num_q, num_k = -(-q_len // block_q), -(-kv_len // block_k)
  batch_size, num_heads = batch or 1, heads or 1
  kv_idx = jnp.arange(num_k * block_k, dtype=jnp.int32)  # [Sp]

  def block_row(index):  # one (example, head, query block) -> kinds [num_k]
    b, h, i = index // (num_heads * num_q), index // num_q % num_heads, index % num_q
    q_idx = i * block_q + jnp.arange(block_q, dtype=jnp.int32)  # [bq]
    real = (q_idx[:, None] < q_len) & (kv_idx[None, :] < kv_len)  # [bq, Sp]
    allowed = mod(b, h, jnp.minimum(q_idx, q_len - 1)[:, None],
                  jnp.minimum(kv_idx, kv_len - 1)[None, :]) & real
    per_block = lambda x: jnp.reshape(x, (block_q, num_k, block_k))  # [bq, K, bk]
    some = jnp.any(per_block(allowed), axis=(0, 2))
    every = jnp.all(per_block(allowed | ~real), axis=(0, 2))
    return blocks.block_kind(every, some)

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


def sigmoid_bias(sigmoid_bias_value, kv_len: int) -> float:
  """The sigmoid attention bias b: as given, or -log(S) (Ramapuram et al. 2024)."""
  return -float(np.log(kv_len)) if sigmoid_bias_value is None else float(sigmoid_bias_value)
