"""Attention with score/mask functions as one fused kernel for NVIDIA GPUs, held to our contract:
Pallas on Triton, with FlashAttention-2's blocking (a program per block of queries and head, an
online softmax over the blocks of keys that are not empty, the mask_mod skipped on full ones;
backward: one kernel for dQ, one for dK and dV, from the forward's log-sum-exp; forward mode:
one tangent kernel over the forward's blocks, bound as a primitive linear in the tangents whose
transpose is the backward kernels, so jvp, jacfwd and linearize run it and grad runs the
backward kernels as before; second order is refused in one line, naming the blockwise kernel).

A mod is traced on scalars (``mods.py``); its jaxpr is evaluated here on whole [bq, bk] blocks
inside the kernel: elementwise primitives on broadcast blocks, and an array the mod closed over,
indexed by scalars (``slopes[h]``, ``table[q_idx - kv_idx]``, a ``dynamic_slice`` in the jaxpr),
read from the kernel's flattened copy of it, one gather per block (Triton has no dynamic_slice).
A floating array a score_mod closes over gets its gradient from the dQ kernel when it is being
differentiated: each read's cotangent (the mod's own vjp on the block), summed per entry in the
program's registers and over programs in a fixed order, so the same bits on every run; its
tangent enters the tangent kernel read by read (each read's value an input of the block's jvp).

The contract's structure (``is_causal``, windows, lengths, segment ids, a mask) becomes one more
mask_mod, with the kinds of blocks it leaves (per example where it comes as arrays), so that its
empty blocks are skipped and its full ones skip the mask_mod; the soft cap becomes part of the
score_mod; a bias it refuses (written as a score_mod it runs here). Off GPU the kernels run only
in Pallas' interpreter (``interpret=True``), which is how the tests run them.

Shape letters: B batch, T query length, S key length, N query heads, K key/value heads, H head
dim; bq, bk the blocks of queries and keys.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_derivatives
from jax import lax
from jax.extend import core as jex_core  # the jaxpr types, as mods (jax.core: Tracer only)
from jax.experimental import pallas as pl

from attention_jax import _checks
from attention_jax import block_masks
from attention_jax import blocks as blocks_lib
from attention_jax import masks as masks_lib
from attention_jax import mods as mods_lib
from attention_jax import structure
from attention_jax import tangent as tangent_lib


BLOCK = 64  # the kernel's default block of queries and keys


class Unservable(ValueError):
  """A mod whose jaxpr the kernel cannot evaluate blockwise."""


@dataclasses.dataclass(frozen=True)
class _Table:
  """A closed-over array as the kernel holds it: a flattened ref and the array's shape; with
  ``reads`` each read appends (flat index block, value block) to it, with ``replay`` each read
  returns the iterator's next value instead (so that the reads' values become inputs to
  differentiate)."""
  ref: object
  shape: tuple[int, ...]
  reads: list | None = None
  replay: object = None


# Primitives that only move a scalar between shapes of size 1: the identity on a block.
_SHAPE_ONLY = ("squeeze", "reshape", "broadcast_in_dim", "reduce_sum", "reduce_max", "reduce_min",
               "reduce_prod", "transpose", "copy")


#: The most iterations of a lax.scan or lax.fori_loop in a mod that the kernel unrolls.
MAX_UNROLL = 32

#: The most entries of traced floating arrays a score_mod closes over (their gradients are summed
#: in each program's registers).
MAX_TRAINED = 4096


def evaluate(jaxpr, tables, *blocks):
  """``jaxpr`` (a mod's, on scalars) on broadcastable ``blocks`` (the score, batch, head, query
  and key indices), its constants read from ``tables`` (``_Table`` objects): one output block."""
  (out,) = _run(jaxpr, tables, blocks)
  return out


def _run(jaxpr, consts, inputs) -> list:
  """Every output of ``jaxpr`` on blocks, one equation at a time."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, inputs))
  read = lambda v: np.asarray(v.val, v.aval.dtype) if isinstance(v, jex_core.Literal) else env[v]
  for eqn in jaxpr.eqns:
    outs = _apply(eqn, [read(v) for v in eqn.invars])
    env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
  return [read(v) for v in jaxpr.outvars]


def _run_closed(closed, inputs) -> list:
  """A sub-jaxpr (a ClosedJaxpr, or a Jaxpr without constants) on blocks; its constants must be
  scalars (a mod's arrays are its own constants, passed in as ``_Table`` inputs)."""
  jaxpr, consts = (closed.jaxpr, closed.consts) if hasattr(closed, "consts") else (closed, ())
  if any(np.size(c) != 1 for c in consts):
    raise Unservable("a jit, cond or loop inside the mod closes over an array of its own")
  return _run(jaxpr, [jnp.reshape(jnp.asarray(c), ()) for c in consts], inputs)


def _apply(eqn, inputs):
  primitive = eqn.primitive.name
  name = eqn.params.get("name", primitive)  # for messages: a jit's is the jnp function's name
  if primitive == "dynamic_slice" and isinstance(inputs[0], _Table):
    return _gather(inputs[0], inputs[1:], eqn.params["slice_sizes"])
  if primitive in _CONTROL_FLOW:
    return _CONTROL_FLOW[primitive](eqn.params, inputs)
  if any(isinstance(x, _Table) for x in inputs) and primitive not in _CALLS:
    raise Unservable(f"the fused kernel reads a closed-over array only by indexing it with "
                     f"scalars; this mod applies {name!r} to the whole array")
  if primitive in _CALLS:  # jit, custom_jvp_call, checkpoint: evaluate the body
    outs = _run_closed(eqn.params[_CALLS[primitive]], inputs)
    return outs if eqn.primitive.multiple_results else _single(outs, name)
  if any(isinstance(p, (jex_core.Jaxpr, jex_core.ClosedJaxpr)) for p in eqn.params.values()):
    raise Unservable(f"the fused kernel cannot evaluate {name!r} inside a mod")
  if any(math.prod(v.aval.shape) != 1 for v in list(eqn.invars) + list(eqn.outvars)):
    raise Unservable(f"the mod forms an array ({name!r}); a mod must work on scalars")
  if primitive in _SHAPE_ONLY:
    return inputs[0]
  shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in inputs))
  inputs = [jnp.broadcast_to(x, shape) for x in inputs]
  return eqn.primitive.bind(*inputs, **eqn.params)


def _single(outs, name):
  if len(outs) != 1:
    raise Unservable(f"{name!r} inside the mod has several outputs")
  return outs[0]


def _cond(params, inputs):
  """lax.cond and lax.switch on blocks: every branch, then each entry's own (a select)."""
  index, *operands = inputs
  branches = [_run_closed(branch, operands) for branch in params["branches"]]
  chosen = []
  for outs in zip(*branches):
    out = outs[-1]
    for i in range(len(outs) - 2, -1, -1):
      out = jnp.where(jnp.asarray(index, jnp.int32) == i, outs[i], out)
    chosen.append(out)
  return chosen


def _scan(params, inputs):
  """lax.scan without inputs to scan over (lax.fori_loop with static bounds is one), unrolled."""
  num_consts, num_carry = mods_lib.scan_layout(params)
  body = params["jaxpr"]
  consts, carry = inputs[:num_consts], inputs[num_consts:num_consts + num_carry]
  if len(inputs) > num_consts + num_carry or len(
      getattr(body, "jaxpr", body).outvars) > num_carry:
    raise Unservable("the fused kernel unrolls a lax.scan in a mod only without xs and ys (a "
                     "lax.fori_loop with static bounds); this one scans over arrays")
  if params["length"] > MAX_UNROLL:
    raise Unservable(f"the fused kernel unrolls a loop in a mod up to {MAX_UNROLL} iterations; "
                     f"this one has {params['length']}")
  for _ in range(params["length"]):
    carry = _run_closed(body, list(consts) + list(carry))
  return carry


def _while(params, inputs):
  del params, inputs
  raise Unservable("the fused kernel cannot evaluate a lax.while_loop in a mod (a trip count "
                   "that may differ from entry to entry; a lax.fori_loop with dynamic bounds is "
                   "one)")


_CONTROL_FLOW = {"cond": _cond, "scan": _scan, "while": _while}
# Calls whose body is evaluated in place: the parameter that holds it.
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
          "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
          "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr", "remat": "jaxpr"}


def _gather(table: _Table, indices, slice_sizes):
  """table[indices] for blocks of indices (dynamic_slice of size 1 clamps them into range)."""
  if any(size != 1 for size in slice_sizes):
    raise Unservable("the mod slices a closed-over array; index it with scalars")
  flat = jnp.int32(0)
  for index, size, stride in zip(indices, table.shape,
                                 np.cumprod((1,) + table.shape[:0:-1])[::-1]):
    flat = flat + jnp.clip(jnp.asarray(index, jnp.int32), 0, size - 1) * int(stride)
  if table.replay is not None:
    return next(table.replay)
  value = table.ref[flat]
  if table.reads is not None:
    table.reads.append((flat, value))
  return value


def table_cotangents(jaxpr, tables, trained, cotangent, *blocks):
  """The gradient reaching each read of the ``trained`` tables (indices into ``tables``) when
  ``cotangent`` [bq, bk] reaches the output of ``jaxpr`` on ``blocks``: [(table index, flat
  index block, its cotangent block)], each block of the read's own shape (a read of slopes[h] is
  one scalar per block: its cotangents summed over the block). The reads are differentiated as
  whole blocks and summed down to their shapes here, one axis at a time (``_whole``)."""
  reads = {i: [] for i in trained}
  recording = [dataclasses.replace(t, reads=reads[i]) if i in reads else t
               for i, t in enumerate(tables)]
  evaluate(jaxpr, recording, *blocks)
  where = [(i, flat) for i in trained for flat, _ in reads[i]]
  shape = jnp.shape(cotangent)

  def output(values):
    replay = iter(values)
    out = evaluate(jaxpr, [dataclasses.replace(t, replay=replay) if i in reads else t
                           for i, t in enumerate(tables)], *blocks)
    return jnp.broadcast_to(out, shape)
  _, pullback = jax.vjp(output, [jnp.broadcast_to(value, shape)
                                 for i in trained for _, value in reads[i]])
  (cotangents,) = pullback(cotangent)
  return [(i, flat, _sum_to(c, jnp.shape(flat))) for (i, flat), c in zip(where, cotangents)]


def _sum_to(block, shape):
  """A [bq, bk] block summed over the axes that ``shape`` (), [bq, 1] or [1, bk] does not
  have, one axis at a time, in that shape."""
  if not shape:
    return _whole(jnp.sum, block)
  for axis, size in enumerate(shape):
    if size == 1 and block.shape[axis] != 1:
      block = jnp.sum(block, axis=axis, keepdims=True)
  return block


def check(mod: mods_lib.Mod | None, dtype=jnp.float32, block=(16, 16)) -> str | None:
  """Why the kernel cannot run ``mod`` (its jaxpr evaluated blockwise), or None."""
  if mod is None:
    return None
  trained = sum(np.size(c) for c in mod.consts
                if isinstance(c, jax.core.Tracer) and mods_lib.is_trainable(c))
  if trained > MAX_TRAINED:
    return (f"the fused kernel gives gradients to closed-over floating arrays of up to "
            f"{MAX_TRAINED} entries together; this mod's traced ones have {trained}")
  tables = [_Table(jnp.reshape(jnp.asarray(c), -1), np.shape(c)) for c in mod.consts]
  index = jnp.zeros(block, jnp.int32)
  blocks = ((jnp.zeros(block, dtype),) if len(mod.jaxpr.invars) == 5 else ()) + (
      jnp.int32(0), jnp.int32(0), index, index)
  try:
    jax.eval_shape(lambda *b: evaluate(mod.jaxpr, tables, *b), *blocks)
  except Unservable as error:
    return str(error)
  except Exception as error:  # pylint: disable=broad-except (the interpreter's own failure)
    first_line = (str(error).splitlines() or [""])[0]
    return (f"the fused kernel's mod interpreter failed on this mod ({type(error).__name__}: "
            f"{first_line}); implementation='chunked' serves it")
  return None


def _block_order(kinds, num_q: int, num_k: int, transpose: bool):
  """Per (example, head, block row), the count of non-empty blocks followed by their entries,
  2 * index + 1 if full (the mask_mod is not evaluated there): int32 [B', N', rows, 1 + cols],
  flattened. ``kinds``: a BlockMask's [B', N', nq, nk] or None (every block partial);
  ``transpose``: rows are key blocks (the dK/dV kernel)."""
  if kinds is None:
    kinds = jnp.full((1, 1, num_q, num_k), blocks_lib.PARTIAL, jnp.int8)
  if transpose:
    kinds = jnp.swapaxes(kinds, -1, -2)
  occupied = kinds != blocks_lib.EMPTY
  order = jnp.argsort(~occupied, axis=-1, stable=True).astype(jnp.int32)
  full = jnp.take_along_axis(kinds == blocks_lib.FULL, order, axis=-1).astype(jnp.int32)
  count = jnp.sum(occupied, axis=-1, keepdims=True, dtype=jnp.int32)
  return jnp.reshape(jnp.concatenate([count, 2 * order + full], axis=-1), (-1,)), kinds.shape[:2]


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What the kernels share: sizes, the mods (traced on scalars) and the scale."""
  scale: float
  block_q: int
  block_k: int
  num_q: int
  num_k: int
  kv_len: int
  group: int  # query heads per key/value head
  mask_shape: tuple[int, int]  # (B', N') of the block mask
  score: mods_lib.Mod | None
  allow: mods_lib.Mod | None
  num_warps: int  # Triton's, per program
  num_stages: int  # Triton's software pipelining of the loop over key blocks
  interpret: bool
  dropout_rate: float = 0.0  # with it, the tables end with the heads' dropout keys
  num_heads: int = 1  # N, to find a head's dropout key
  max_scores: bool = False  # the forward kernel also writes each row's largest score
  trained: tuple[int, ...] = ()  # the score_mod's tables that get gradients (the dQ kernel's)

  @property
  def trained_slots(self) -> tuple[tuple[int, ...], int]:
    """Where each trained table's gradient starts in a program's slots, and their width: the
    tables' entries side by side, rounded up to a power of two (Triton's blocks)."""
    sizes = [math.prod(np.shape(self.score.consts[i])) for i in self.trained]
    starts = tuple(int(x) for x in np.cumsum([0] + sizes[:-1]))
    return starts, max(16, 1 << (max(sum(sizes), 1) - 1).bit_length())

  def dropout(self, keys, b, h, q_start, k_start):
    """Inverted dropout's mask on the block at (q_start, k_start) [bq, bk], True where kept, or
    None: the blockwise kernel's counter-based mask (``blocks.dropout_keep``), the same
    entries."""
    if not self.dropout_rate:
      return None
    index = 2 * (b * self.num_heads + h) if keys.shape[0] > 2 else 0  # [B * N * 2] or [2]
    key_data = (keys[index], keys[index + 1])
    q_idx, kv_idx = self.indices(q_start, k_start)  # [bq, 1], [1, bk]
    return blocks_lib.dropout_keep(key_data, q_idx, kv_idx, self.dropout_rate)

  def loop(self, order_ref, i, b, h, step, init, transpose: bool = False):
    """``carry = step(start, full, carry)`` from ``init`` over the non-empty blocks of block row
    ``i`` of (example b, head h), in ``order_ref``'s ``_block_order`` list: ``start``, the
    block's first key (first query with ``transpose``), ``full``: the block is full."""
    rows, cols = (self.num_k, self.num_q) if transpose else (self.num_q, self.num_k)
    block = self.block_q if transpose else self.block_k
    mb, mn = self.mask_shape
    row = (((b % mb) * mn + h % mn) * rows + i) * (1 + cols)  # where the row's list starts

    def body(t, carry):
      entry = order_ref[row + 1 + t]
      return step(entry // 2 * block, entry % 2 == 1, carry)
    return lax.fori_loop(0, order_ref[row], body, init)

  def tables(self, refs):
    """The mods' tables (``_Table`` objects over the first refs), the dropout keys' ref (or
    None), and the refs after them."""
    consts = [(mod, c) for mod in (self.score, self.allow) if mod is not None
              for c in mod.consts]
    tables = [_Table(ref, np.shape(c)) for ref, (_, c) in zip(refs, consts)]
    n = len(self.score.consts) if self.score is not None else 0
    rest = refs[len(consts):]
    keys, rest = (rest[0], rest[1:]) if self.dropout_rate else (None, rest)
    return (tables[:n], tables[n:]), keys, rest

  def indices(self, q_start, k_start):
    """The query indices [bq, 1] and key indices [1, bk] of the block at (q_start, k_start):
    what a mod computes from one of them alone is computed once per row or column."""
    return (q_start + lax.broadcasted_iota(jnp.int32, (self.block_q, 1), 0),
            k_start + lax.broadcasted_iota(jnp.int32, (1, self.block_k), 1))

  def logits(self, q, k, tables, b, h, q_start, k_start, full):
    """Scaled, modded logits [bq, bk] (-inf where masked), d(score_mod)/d(score) or None, and
    the scaled logits before the score_mod; ``full``: the block is full, the mask_mod is not
    evaluated."""
    raw = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * self.scale
    q_idx, kv_idx = self.indices(q_start, k_start)
    s, derivative = raw, None
    if self.score is not None:
      modded = lambda x: jnp.broadcast_to(
          evaluate(self.score.jaxpr, tables[0], x, b, h, q_idx, kv_idx), x.shape)
      s, derivative = jax.jvp(modded, (raw,), (jnp.ones_like(raw),))
    return jnp.where(self.allowed(tables, b, h, q_start, k_start, full), s, -jnp.inf), (
        derivative), raw

  def allowed(self, tables, b, h, q_start, k_start, full):
    """Where the block at (q_start, k_start) attends [bq, bk]: keys in range that the mask_mod
    allows (not evaluated on a ``full`` block)."""
    q_idx, kv_idx = self.indices(q_start, k_start)
    shape = (self.block_q, self.block_k)
    allowed = jnp.broadcast_to(kv_idx < self.kv_len, shape)
    if self.allow is None:
      return allowed
    return allowed & lax.cond(
        full, lambda: jnp.ones(shape, jnp.bool_),
        lambda: jnp.broadcast_to(evaluate(self.allow.jaxpr, tables[1], b, h, q_idx, kv_idx),
                                 shape))

  def logits_tangent(self, q, k, d_q, d_k, tables, d_tables, b, h, q_start, k_start, full):
    """The logits [bq, bk] as ``logits`` gives them and their tangents (0 where masked), from
    the tangents of the q [bq, H] and k [bk, H] blocks and of the trained tables (``d_tables``,
    refs in ``trained``'s order): jax.jvp of the score path, each read of a trained table an
    input whose tangent is read from its tangent's ref at the same index."""
    dot = lambda a, c: jnp.dot(a, c.T, preferred_element_type=jnp.float32) * self.scale
    s, ds = dot(q, k), dot(d_q, k) + dot(q, d_k)
    if self.score is not None:
      q_idx, kv_idx = self.indices(q_start, k_start)
      reads = {i: [] for i in self.trained}
      evaluate(self.score.jaxpr, [dataclasses.replace(t, reads=reads[i]) if i in reads else t
                                  for i, t in enumerate(tables[0])], s, b, h, q_idx, kv_idx)

      def modded(x, values):
        replay = iter(values)
        replayed = [dataclasses.replace(t, replay=replay) if i in reads else t
                    for i, t in enumerate(tables[0])]
        return jnp.broadcast_to(evaluate(self.score.jaxpr, replayed, x, b, h, q_idx, kv_idx),
                                x.shape)
      values = [value for i in self.trained for _, value in reads[i]]
      d_values = [d_table[flat] for d_table, i in zip(d_tables, self.trained)
                  for flat, _ in reads[i]]
      s, ds = jax.jvp(modded, (s, values), (ds, d_values))
    allowed = self.allowed(tables, b, h, q_start, k_start, full)
    return jnp.where(allowed, s, -jnp.inf), jnp.where(allowed, ds, 0.0)

  def read_shapes(self):
    """``table_reads``' list for any block: (start, flat, cotangent), shapes in place of arrays
    (traced on stand-in tables; nothing is computed)."""
    tables = [_Table(jnp.zeros(max(1, math.prod(np.shape(c))), jnp.result_type(c)), np.shape(c))
              for c in self.score.consts]
    starts = []

    def reads():
      block = jnp.zeros((self.block_q, self.block_k), jnp.float32)
      found = self.table_reads(tables, block, block, 0, 0, 0, 0)
      starts.extend(start for start, _, _ in found)
      return [(flat, cotangent) for _, flat, cotangent in found]
    shapes = jax.eval_shape(reads)
    return [(start, flat, cotangent) for start, (flat, cotangent) in zip(starts, shapes)]

  def table_reads(self, score_tables, raw, d_score, b, h, q_start, k_start):
    """The trained tables' reads on this block with their cotangents, given dL/d(score_mod's
    output) [bq, bk]: [(where the table's slots start, flat index, cotangent)], both of the
    read's shape: () or [bq, 1] (the same indices on every key block), [1, bk] (the same on
    every query block) or [bq, bk]."""
    q_idx, kv_idx = self.indices(q_start, k_start)
    starts = self.trained_slots[0]
    return [(starts[self.trained.index(i)], jnp.broadcast_to(flat, jnp.shape(cotangent)),
             cotangent.astype(jnp.float32))
            for i, flat, cotangent in table_cotangents(self.score.jaxpr, score_tables,
                                                       self.trained, d_score, raw, b, h, q_idx,
                                                       kv_idx)]


def _varies(read) -> tuple[bool, bool]:
  """Whether a read's indices vary along the queries and along the keys of a block."""
  shape = jnp.shape(read[1])
  return (len(shape) == 2 and shape[0] > 1), (len(shape) == 2 and shape[1] > 1)


def _add_by_range(slots, start, flat, cotangent):
  """slots [W] plus the cotangents summed per index, for each index from the least to the
  greatest the block reads, in that order (a read that varies along queries and keys: a few
  distances or buckets per block)."""
  slot = lax.broadcasted_iota(jnp.int32, slots.shape, 0)

  def add(m, slots):
    return slots + jnp.where(slot == start + m,
                             _whole(jnp.sum, jnp.where(flat == m, cotangent, 0.0)), 0.0)
  return lax.fori_loop(_whole(jnp.min, flat), _whole(jnp.max, flat) + 1, add, slots)


def _whole(reduce, x):
  """``reduce`` over every axis of a block, one axis at a time (jax 0.12's Triton lowering fails
  on a reduction over two axes at once under an explicit abstract mesh)."""
  for _ in range(jnp.ndim(x)):
    x = reduce(x, axis=-1)
  return x


def _add_by_entry(slots, start, flat, cotangent):
  """slots [W] plus each entry of a read of shape (), [bq, 1] or [1, bk], one after another
  (once per program: these reads are summed over its blocks first)."""
  slot = lax.broadcasted_iota(jnp.int32, slots.shape, 0)
  if not jnp.shape(flat):
    return slots + jnp.where(slot == start + flat, cotangent, 0.0)
  position = lax.broadcasted_iota(jnp.int32, jnp.shape(flat), 0 if jnp.shape(flat)[0] > 1 else 1)

  def add(e, slots):
    pick = lambda x: _whole(jnp.sum, jnp.where(position == e, x, jnp.zeros_like(x)))  # noqa: E731
    return slots + jnp.where(slot == start + pick(flat), pick(cotangent), 0.0)
  return lax.fori_loop(0, math.prod(jnp.shape(flat)), add, slots)


def _held(reads, along_keys: bool):
  """The reads a program sums over its blocks before adding them to its slots: in the dQ
  kernel (a block row) those that do not vary along the keys, in the dK/dV kernel (a block
  column) those that vary along the keys only."""
  return [read for read in reads if _varies(read) == (False, True)] if along_keys else [
      read for read in reads if not _varies(read)[1]]


def _forward_kernel(order_ref, q_ref, k_ref, v_ref, *refs, plan):
  tables, keys, (out_ref, lse_ref, *max_ref) = plan.tables(refs)
  i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q = q_ref[...]  # [bq, H]

  def step(k_start, full, carry):
    acc, m, l = carry  # [bq, H_v], [bq], [bq]
    k = k_ref[pl.ds(k_start, plan.block_k), :]  # [bk, H]
    v = v_ref[pl.ds(k_start, plan.block_k), :]  # [bk, H_v]
    s, _, _ = plan.logits(q, k, tables, b, h, i * plan.block_q, k_start, full)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe[:, None])
    alpha = jnp.exp(m - m_safe)
    kept = plan.dropout(keys, b, h, i * plan.block_q, k_start)  # the normaliser keeps p
    dropped = p if kept is None else jnp.where(kept, p, 0.0)
    acc = acc * alpha[:, None] + jnp.dot(dropped.astype(v.dtype), v,
                                         preferred_element_type=jnp.float32)
    return acc, m_new, l * alpha + jnp.sum(p, axis=1)

  init = (jnp.zeros((plan.block_q, v_ref.shape[-1]), jnp.float32),
          jnp.full((plan.block_q,), -jnp.inf, jnp.float32),
          jnp.zeros((plan.block_q,), jnp.float32))
  acc, m, l = plan.loop(order_ref, i, b, h, step, init)
  empty = l == 0.0
  scale = blocks_lib.dropout_scale(plan.dropout_rate)
  out_ref[...] = (acc * (scale / jnp.where(empty, 1.0, l))[:, None]).astype(out_ref.dtype)
  lse_ref[...] = jnp.where(empty, -jnp.inf, m + jnp.log(jnp.where(empty, 1.0, l)))
  if plan.max_scores:
    max_ref[0][...] = jnp.where(empty, -jnp.inf, m)  # each row's largest score


def _tangent_kernel(order_ref, q_ref, k_ref, v_ref, lse_ref, dq_ref, dk_ref, dv_ref, *refs,
                   plan):
  """The tangents of a block of queries' out and lse, over its key blocks as the forward walks
  them, with the forward's log-sum-exp (P = exp(S - lse), no rescaling):

    dS_j = the logits' tangent (q's, k's and the trained tables')
    d lse = sum_j P_j dS_j
    d out = c sum_j keep_j P_j (dS_j V_j + dV_j) - d lse out,  out = c sum_j keep_j P_j V_j

  dropout's mask (keep, c = 1 / (1 - rate)) the forward's; the normaliser's tangent reads the
  undropped P; out is summed again here in float32 (the forward's, rounded to the inputs'
  dtype, would cost the difference its precision in 16-bit dtypes)."""
  tables, keys, rest = plan.tables(refs)
  d_tables, (d_out_ref, d_lse_ref) = rest[:len(plan.trained)], rest[len(plan.trained):]
  i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q, d_q, lse = q_ref[...], dq_ref[...], lse_ref[...]
  lse = jnp.where(lse == -jnp.inf, 0.0, lse)  # a row with no key: P = 0

  def step(k_start, full, carry):
    acc, out, d_lse = carry  # [bq, H_v], [bq, H_v], [bq]
    cols = pl.ds(k_start, plan.block_k)
    k, v, d_k, d_v = k_ref[cols, :], v_ref[cols, :], dk_ref[cols, :], dv_ref[cols, :]
    s, ds = plan.logits_tangent(q, k, d_q, d_k, tables, d_tables, b, h, i * plan.block_q,
                                k_start, full)
    p = jnp.exp(s - lse[:, None])
    kept = plan.dropout(keys, b, h, i * plan.block_q, k_start)
    dropped = p if kept is None else jnp.where(kept, p, 0.0)
    product = lambda x, y: jnp.dot(x.astype(y.dtype), y, preferred_element_type=jnp.float32)
    acc = acc + product(dropped * ds, v) + product(dropped, d_v)
    return acc, out + product(dropped, v), d_lse + jnp.sum(p * ds, axis=1)

  zeros = jnp.zeros((plan.block_q, v_ref.shape[-1]), jnp.float32)
  acc, out, d_lse = plan.loop(order_ref, i, b, h, step,
                              (zeros, zeros, jnp.zeros((plan.block_q,), jnp.float32)))
  scale = blocks_lib.dropout_scale(plan.dropout_rate)
  d_out_ref[...] = (scale * (acc - d_lse[:, None] * out)).astype(d_out_ref.dtype)
  d_lse_ref[...] = d_lse


def _weights_gradient(plan, q, k, v, do, lse, delta, tables, keys, b, h, q_start, k_start,
                      full):
  """The weights applied, P (where dropout keeps them) [bq, bk], dL/d(logits before the
  score_mod) [bq, bk] of one block pair, and the trained tables' reads with their cotangents
  (``_Plan.table_reads``; none without trained tables)."""
  s, derivative, raw = plan.logits(q, k, tables, b, h, q_start, k_start, full)
  p = jnp.exp(s - jnp.where(lse == -jnp.inf, 0.0, lse)[:, None])
  dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
  kept = plan.dropout(keys, b, h, q_start, k_start)
  if kept is not None:  # out = c (P * keep) V: dP = c keep dO V^T (c is in dO already)
    dp = jnp.where(kept, dp, 0.0)
  ds = p * (dp - delta[:, None])  # dL/d(score_mod's output), 0 where masked
  applied = p if kept is None else jnp.where(kept, p, 0.0)  # dV = (P * keep)^T c dO
  d_logits = ds if derivative is None else jnp.where(p > 0.0, ds * derivative, 0.0)
  reads = plan.table_reads(tables[0], raw, ds, b, h, q_start, k_start) if plan.trained else []
  return applied, d_logits, reads


def _dq_kernel(order_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan):
  """dQ of a block of queries, and (with trained tables) this program's share of their
  gradients, summed over its key blocks in registers."""
  tables, keys, (dq_ref, *slots_ref) = plan.tables(refs)
  i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

  def gradients(k_start, full):
    k = k_ref[pl.ds(k_start, plan.block_k), :]
    v = v_ref[pl.ds(k_start, plan.block_k), :]
    _, ds, reads = _weights_gradient(plan, q, k, v, do, lse, delta, tables, keys, b, h,
                                     i * plan.block_q, k_start, full)
    return jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32), reads

  def step(k_start, full, carry):
    dq, slots, held = carry
    d_q, reads = gradients(k_start, full)
    for read in reads:  # varying along queries and keys: added block by block
      if _varies(read) == (True, True):
        slots = _add_by_range(slots, *read)
    held = [(flat, total + c) for (_, total), (_, flat, c) in zip(held, _held(reads, False))]
    return dq + d_q, slots, held

  slots = jnp.zeros((plan.trained_slots[1],), jnp.float32)
  shapes = _held(plan.read_shapes(), False) if plan.trained else []  # summed over key blocks
  held = [(jnp.zeros(flat.shape, jnp.int32), jnp.zeros(flat.shape, jnp.float32))
          for _, flat, _ in shapes]
  dq, slots, held = plan.loop(order_ref, i, b, h, step,
                              (jnp.zeros(q.shape, jnp.float32), slots, held))
  dq_ref[...] = (dq * plan.scale).astype(dq_ref.dtype)
  if plan.trained:
    for (start, _, _), (flat, total) in zip(shapes, held):
      slots = _add_by_entry(slots, start, flat, total)
    slots_ref[0][...] = slots


def _dkv_kernel(order_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan):
  """dK and dV of a block of keys, and (with trained tables) this program's share of the
  gradients of the reads that vary along the keys only, summed over its query blocks."""
  tables, keys, (dk_ref, dv_ref, *slots_ref) = plan.tables(refs)
  j, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  k, v = k_ref[...], v_ref[...]  # [bk, H], [bk, H_v]
  shapes = _held(plan.read_shapes(), True) if plan.trained else []

  def step(q_start, full, carry):
    dk, dv, held = carry
    rows = pl.ds(q_start, plan.block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    p, ds, reads = _weights_gradient(plan, q, k, v, do, lse_ref[rows], delta_ref[rows], tables,
                                     keys, b, h, q_start, j * plan.block_k, full)
    held = [(flat, total + c) for (_, total), (_, flat, c) in zip(held, _held(reads, True))]
    dv = dv + jnp.dot(p.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
    dk = dk + jnp.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32)
    return dk, dv, held

  held = [(jnp.zeros(flat.shape, jnp.int32), jnp.zeros(flat.shape, jnp.float32))
          for _, flat, _ in shapes]
  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32), held)
  dk, dv, held = plan.loop(order_ref, j, b, h, step, init, transpose=True)
  dk_ref[...] = (dk * plan.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)
  if plan.trained:
    slots = jnp.zeros((plan.trained_slots[1],), jnp.float32)
    for (start, _, _), (flat, total) in zip(shapes, held):
      slots = _add_by_entry(slots, start, flat, total)
    slots_ref[0][...] = slots


def _call(kernel, plan, grid, inputs, in_specs, out_shape, out_specs):
  """``kernel`` as a Pallas Triton call; every program reads the whole block order and
  tables (flattened) besides its blocks."""
  whole = lambda x: pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)
  order, *arrays, tables = inputs
  params = {} if plan.interpret else dict(compiler_params=_triton().CompilerParams(
      num_warps=plan.num_warps, num_stages=plan.num_stages))
  return pl.pallas_call(
      functools.partial(kernel, plan=plan), grid=grid, out_shape=out_shape,
      in_specs=[whole(order)] + in_specs + [whole(t) for t in tables], out_specs=out_specs,
      interpret=plan.interpret, **params)(order, *arrays, *tables)


def _triton():
  """Pallas' Triton backend (deprecated from jax 0.11 on, in favour of Mosaic GPU); imported
  only when a kernel is compiled for a GPU, so that its deprecation warning reaches only those
  who run this kernel."""
  from jax.experimental.pallas import triton  # pylint: disable=g-import-not-at-top
  return triton


def missing_backend() -> str | None:
  """Why the kernel cannot be compiled in this jax (its Pallas Triton backend is gone), or
  None."""
  try:
    _triton()
  except ImportError as error:
    return (f"the fused Pallas GPU kernel needs Pallas' Triton backend, which jax "
            f"{jax.__version__} does not have ({error}); implementation='chunked' runs the same "
            "mods blockwise")
  return None


def refusal(query, key, value, request) -> str | None:
  """Why the kernel cannot serve ``request`` here, or None: no Pallas Triton backend in this
  jax, or a mod it cannot evaluate blockwise (``check``: a traced floating array it closes
  over, control flow it refuses, or any failure of its mod interpreter), so that the automatic
  choice passes such calls to the blockwise kernel; an attention.Kernel check."""
  del query, key, value
  if reason := missing_backend():
    return reason
  for mod in (mods_lib.trace_score_mod(request.score_mod, jnp.float32),
              mods_lib.trace_mask_mod(request.mask_mod)):
    if reason := check(mod):
      return reason
  return None


def _specs(plan, head_dim, value_dim):
  """BlockSpecs of [B, L, N or K, H] arrays and [B, N, T] statistics, for grid (rows, B, N):
  program i's block row, or (``_all``) every row; a row of queries (q, o, stat) or keys (k, v,
  dk, dv)."""
  def spec(rows, dim, kv=False, whole=False):  # kv: K heads, query head h reads h // group
    return pl.BlockSpec((None, rows, None, dim),
                        lambda i, b, h: (b, 0 if whole else i, h // plan.group if kv else h, 0))
  q_pad, kv_pad = plan.num_q * plan.block_q, plan.num_k * plan.block_k
  return dict(
      q=spec(plan.block_q, head_dim), o=spec(plan.block_q, value_dim),
      q_all=spec(q_pad, head_dim, whole=True), do_all=spec(q_pad, value_dim, whole=True),
      k=spec(plan.block_k, head_dim, kv=True), v=spec(plan.block_k, value_dim, kv=True),
      k_all=spec(kv_pad, head_dim, kv=True, whole=True),
      v_all=spec(kv_pad, value_dim, kv=True, whole=True),
      dk=spec(plan.block_k, head_dim), dv=spec(plan.block_k, value_dim),  # per query head
      stat=pl.BlockSpec((None, None, plan.block_q), lambda i, b, h: (b, h, i)),
      stat_all=pl.BlockSpec((None, None, q_pad), lambda i, b, h: (b, h, 0)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _attention(plan, q, k, v, orders, tables):
  return _attention_fwd(plan, q, k, v, orders, tables)


def _attention_fwd(plan, q, k, v, orders, tables):
  """The forward kernel: out [B, Tp, N, Hv], lse [B, N, Tp] and (with ``plan.max_scores``) the
  row maxima [B, N, Tp] in a tuple."""
  batch, q_pad, num_heads, head_dim = q.shape
  value_dim = v.shape[-1]
  specs = _specs(plan, head_dim, value_dim)
  statistic = jax.ShapeDtypeStruct((batch, num_heads, q_pad), jnp.float32)
  statistics = 2 if plan.max_scores else 1  # lse, and the row maxima where asked for
  out, lse, *row_max = _call(
      _forward_kernel, plan, (plan.num_q, batch, num_heads), (orders[0], q, k, v, tables),
      [specs["q"], specs["k_all"], specs["v_all"]],
      (jax.ShapeDtypeStruct((batch, q_pad, num_heads, value_dim), q.dtype),)
      + (statistic,) * statistics, (specs["o"],) + (specs["stat"],) * statistics)
  return out, lse, tuple(row_max)


SECOND_ORDER_ERROR = (
    "implementation='pallas_gpu' serves reverse mode (grad) and first-order forward mode (jvp, "
    "jacfwd, linearize); second order (jax.hessian, a grad of a jvp, a jvp of a grad, a grad of "
    "a grad) has no fused kernel: use implementation='chunked', which serves jax.hessian, a jvp "
    "of a grad and a grad of a jvp.")


def _dense_zeros(x):
  """A tangent as an array (a symbolic zero as zeros)."""
  return jnp.zeros(x.shape, x.dtype) if isinstance(x, custom_derivatives.SymbolicZero) else x


def _attention_jvp(plan, primals, tangents):
  """The tangents of out and lse by the tangent kernel, bound as a primitive linear in the
  tangents of q, k, v and of the score_mod's floating tables being differentiated, that
  transposes to the backward kernels (attention_jax.tangent): jvp runs the tangent kernel, grad
  the backward kernels as the custom VJP did. Row maxima get zero tangents."""
  q, k, v, orders, tables = primals
  d_q, d_k, d_v, _, d_tables = tangents
  outputs = _attention(plan, q, k, v, orders, tables)
  scored = len(plan.score.consts) if plan.score is not None else 0
  trained = tuple(i for i in range(scored) if mods_lib.is_trainable(tables[i]) and not isinstance(
      d_tables[i], custom_derivatives.SymbolicZero))
  derivatives = _Derivatives(dataclasses.replace(plan, trained=trained))
  point = (q, k, v, tuple(tables[i] for i in trained))
  d_point = tuple(map(_dense_zeros, (d_q, d_k, d_v))) + (
      tuple(_dense_zeros(d_tables[i]) for i in trained),)
  d_out, d_lse = tangent_lib.linear(
      derivatives.tangent, derivatives.cotangent, (point, (orders, tables) + outputs[:2]),
      d_point, like=outputs[:2], second_order=SECOND_ORDER_ERROR)
  return outputs, (d_out, d_lse, tuple(jnp.zeros_like(x) for x in outputs[2]))


_attention.defjvp(_attention_jvp, symbolic_zeros=True)


@dataclasses.dataclass(frozen=True)
class _Derivatives:
  """The kernel's tangent (forward mode: the tangent kernel) and its transpose (reverse mode:
  the backward kernels) for one plan, whose ``trained`` names the tables differentiated.
  residuals: the point (q, k, v, the trained tables), whose tangents and cotangents these are,
  and (orders, tables, out, lse)."""
  plan: _Plan

  def _tables(self, trained, tables) -> tuple:
    tables = list(tables)
    for i, table in zip(self.plan.trained, trained):
      tables[i] = table
    return tuple(tables)

  def tangent(self, residuals, tangents):
    (q, k, v, trained), (orders, tables, out, lse) = residuals
    d_q, d_k, d_v, d_trained = tangents
    return _tangent(self.plan, q, k, v, out, lse, orders, self._tables(trained, tables), d_q,
                    d_k, d_v, d_trained)

  def cotangent(self, residuals, cotangents):
    (q, k, v, trained), (orders, tables, out, lse) = residuals
    d_q, d_k, d_v, d_tables = _backward(self.plan, q, k, v, out, lse, orders,
                                        self._tables(trained, tables), *cotangents)
    return d_q, d_k, d_v, tuple(d_tables[i] for i in self.plan.trained)


def _tangent(plan, q, k, v, out, lse, orders, tables, d_q, d_k, d_v, d_trained):
  """The tangent kernel: the tangents of out [B, Tp, N, Hv] and lse [B, N, Tp] from those of
  q, k, v and of the trained tables (``d_trained``, in ``plan.trained``'s order)."""
  batch, q_pad, num_heads, head_dim = q.shape
  specs = _specs(plan, head_dim, v.shape[-1])
  d_trained = tuple(jnp.reshape(d, (-1,)) for d in d_trained)
  return tuple(_call(
      _tangent_kernel, plan, (plan.num_q, batch, num_heads),
      (orders[0], q, k, v, lse, d_q, d_k, d_v, tables + d_trained),
      [specs[name] for name in ("q", "k_all", "v_all", "stat", "q", "k_all", "v_all")],
      (jax.ShapeDtypeStruct(out.shape, out.dtype),
       jax.ShapeDtypeStruct((batch, num_heads, q_pad), jnp.float32)),
      (specs["o"], specs["stat"])))


def _backward(plan, q, k, v, out, lse, orders, tables, d_out, d_lse):
  """The backward kernels: dQ, dK, dV and the gradients of the tables ``plan.trained`` names
  (None for the others), from the cotangents of out and of the log-sum-exp."""
  batch, q_pad, num_heads, head_dim = q.shape
  kv_pad, value_dim = k.shape[1], v.shape[-1]
  delta = jnp.einsum("bthd,bthd->bht", d_out.astype(jnp.float32), out.astype(jnp.float32))
  delta = delta - d_lse  # a cotangent of the log-sum-exp enters as -delta would
  if plan.dropout_rate:  # dropout's 1 / (1 - rate), once here rather than on every dP, dV
    scale = blocks_lib.dropout_scale(plan.dropout_rate)
    d_out = (d_out.astype(jnp.float32) * scale).astype(d_out.dtype)
  specs = _specs(plan, head_dim, value_dim)
  width = plan.trained_slots[1]  # each program's share of the trained tables' gradients
  slots_shape = lambda rows: (jax.ShapeDtypeStruct(  # noqa: E731
      (rows, batch, num_heads, width), jnp.float32),) * bool(plan.trained)
  slots_spec = (pl.BlockSpec((None, None, None, width), lambda i, b, h: (i, b, h, 0)),) * bool(
      plan.trained)
  dq, *slots = _call(
      _dq_kernel, plan, (plan.num_q, batch, num_heads),
      (orders[0], q, k, v, d_out, lse, delta, tables),
      [specs["q"], specs["k_all"], specs["v_all"], specs["o"], specs["stat"], specs["stat"]],
      (jax.ShapeDtypeStruct(q.shape, q.dtype),) + slots_shape(plan.num_q),
      (specs["q"],) + slots_spec)
  per_head = lambda dim, dtype: jax.ShapeDtypeStruct((batch, kv_pad, num_heads, dim), dtype)
  dk, dv, *key_slots = _call(
      _dkv_kernel, plan, (plan.num_k, batch, num_heads),
      (orders[1], q, k, v, d_out, lse, delta, tables),
      [specs[name] for name in ("q_all", "k", "v", "do_all", "stat_all", "stat_all")],
      (per_head(head_dim, jnp.float32), per_head(value_dim, jnp.float32)) + slots_shape(
          plan.num_k),
      (specs["dk"], specs["dv"]) + slots_spec)
  d_tables = [None] * len(tables)
  if plan.trained:  # every program's share, summed in a fixed order
    summed = jnp.sum(slots[0], axis=(0, 1, 2)) + jnp.sum(key_slots[0], axis=(0, 1, 2))
    for i, start in zip(plan.trained, plan.trained_slots[0]):
      d_tables[i] = summed[start:start + tables[i].size].astype(tables[i].dtype)
  by_kv_head = lambda x: jnp.sum(jnp.reshape(x, x.shape[:2] + (-1, plan.group) + x.shape[3:]),
                                 axis=3)  # [B, S, N, H] -> [B, S, K, H]
  return dq, by_kv_head(dk).astype(k.dtype), by_kv_head(dv).astype(v.dtype), d_tables




def _is_block(size: int) -> bool:
  return size >= 16 and not size & (size - 1)  # Triton's blocks: powers of two


def block_kinds(mask_mod, batch: int, heads: int, q_len: int, kv_len: int, blocks):
  """``make_block_mask``'s kinds [batch, heads, T / bq, S / bk] at the kernel's ``blocks``
  (bq, bk)."""
  return block_masks.make_block_mask(mask_mod, batch, heads,
                                     blocks_lib.round_up(q_len, blocks[0]),
                                     blocks_lib.round_up(kv_len, blocks[1]),
                                     block_size=blocks).kinds


def _kernel_blocks(block_mask: block_masks.BlockMask | None, block_size: int):
  """The kernel's blocks (bq, bk) and the block mask's kinds at them (None without one): its own
  blocks where they suit Triton, else ``block_size``'s, its kinds made again there."""
  if block_mask is None:
    return (block_size, block_size), None
  blocks = (block_mask.block_q, block_mask.block_k)
  if _is_block(blocks[0]) and _is_block(blocks[1]):
    return blocks, block_mask.kinds
  blocks = (block_size, block_size)
  return blocks, block_kinds(block_mask.mask_mod, *block_mask.kinds.shape[:2], block_mask.q_len,
                             block_mask.kv_len, blocks)




def flex_attention(query, key, value, *, scale: float, score_mod=None, mask_mod=None,
                   block_mask: block_masks.BlockMask | None = None, block_size: int = BLOCK,
                   num_warps: int = 4, num_stages: int = 2, interpret: bool = False,
                   return_max_scores: bool = False, dropout_rate: float = 0.0,
                   dropout_rng=None, broadcast_dropout: bool = True):
  """Attention with a score_mod and a mask_mod (or a block mask) in one fused kernel:
  query [..., T, N, H], key [..., S, K, H], value [..., S, K, H_v] -> (output [..., T, N, H_v],
  log-sum-exp [..., T, N]; -inf on a row that attends to nothing, whose output is 0), and with
  ``return_max_scores`` each row's largest score [..., T, N] (the same way, no gradient).
  ``dropout_rate`` > 0 with ``dropout_rng``: dropout on the weights with the blockwise kernel's
  counter-based masks (the same entries as ``chunked`` for the same key), regenerated in the
  backward kernels; one mask for every example and head with ``broadcast_dropout``.

  ``block_size``: of queries and keys (a power of two, at least 16), unless ``block_mask``
  brings blocks of that kind. ``num_warps``, ``num_stages``: Triton's (the defaults, with
  blocks of 64, were the fastest of six settings tried on an H200 at T = 8192, H = 64).
  ``interpret``: run the kernels in Pallas' interpreter (any backend).

  >>> q = k = v = jnp.ones((1, 100, 2, 16))  # [B, T, N, H]
  >>> alibi = lambda score, b, h, q_idx, kv_idx: score - 0.5 * (q_idx - kv_idx)
  >>> causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  >>> out, lse = flex_attention(q, k, v, scale=0.25, score_mod=alibi, mask_mod=causal,
  ...                           interpret=True)
  >>> out.shape, lse.shape
  ((1, 100, 2, 16), (1, 100, 2))
  """
  batch_shape, (q_len, num_heads, head_dim) = query.shape[:-3], query.shape[-3:]
  kv_len, num_kv_heads, value_dim = key.shape[-3], key.shape[-2], value.shape[-1]
  flat = lambda x: jnp.reshape(x, (-1,) + x.shape[-3:])
  batch = math.prod(batch_shape)
  mask_mod = block_masks.check_block_mask(block_mask, mask_mod, batch, num_heads, q_len, kv_len)
  dropout_rate = _checks.dropout(dropout_rate, dropout_rng, deterministic=False)
  if not interpret and (reason := missing_backend()):
    raise ValueError(reason + ".")
  if not _is_block(block_size):
    raise ValueError(f"the fused kernel's blocks must be powers of two from 16, got "
                     f"block_size={block_size}.")
  (block_q, block_k), kinds = _kernel_blocks(block_mask, block_size)
  score = mods_lib.trace_score_mod(score_mod, jnp.float32)
  allow = mods_lib.trace_mask_mod(mask_mod)
  for mod in (score, allow):
    if reason := check(mod):
      raise ValueError(f"{reason}; use implementation='chunked'.")
  num_q, num_k = -(-q_len // block_q), -(-kv_len // block_k)
  forward, mask_shape = _block_order(kinds, num_q, num_k, transpose=False)
  backward, _ = _block_order(kinds, num_q, num_k, transpose=True)
  plan = _Plan(float(scale), block_q, block_k, num_q, num_k, kv_len, num_heads // num_kv_heads,
               tuple(mask_shape), score, allow, num_warps, num_stages, interpret,
               float(dropout_rate), num_heads, return_max_scores)
  width = lambda dim: max(16, 1 << (dim - 1).bit_length())  # Triton's blocks: powers of two
  pad, round_up = blocks_lib.pad_axis, blocks_lib.round_up
  prepare = lambda x, block, dim: pad(pad(flat(x), 1, round_up(x.shape[-3], block),
                                          broadcasts=False), 3, width(dim), broadcasts=False)
  tables = tuple(jnp.reshape(jnp.asarray(c), (-1,)) for mod in (score, allow) if mod is not None
                 for c in mod.consts)
  if dropout_rate:  # the dropout key of every (example, head), flattened, or one for all
    tables += (jnp.reshape(blocks_lib.head_keys(dropout_rng, batch, num_heads,
                                                broadcast_dropout), (-1,)),)
  out, lse, row_max = _attention(
      plan, prepare(query, block_q, head_dim), prepare(key, block_k, head_dim),
      prepare(value, block_k, value_dim), (forward, backward), tables)
  out = jnp.reshape(out[:, :q_len, :, :value_dim], batch_shape + (q_len, num_heads, value_dim))
  per_row = lambda x: jnp.reshape(jnp.swapaxes(x[:, :, :q_len], 1, 2),
                                  batch_shape + (q_len, num_heads))
  if return_max_scores:
    return out, per_row(lse), lax.stop_gradient(per_row(row_max[0]))
  return out, per_row(lse)


def pallas_gpu_attention(query, key, value, mask=None, *, scale: float, is_causal: bool = False,
                         local_window_size=None, logits_soft_cap: float | None = None,
                         query_seq_lengths=None, key_value_seq_lengths=None,
                         query_segment_ids=None, key_segment_ids=None, score_mod=None,
                         mask_mod=None, block_mask=None, return_residual: bool = False,
                         interpret: bool = False,
                         return_max_scores: bool = False, dropout_rate: float = 0.0,
                         dropout_rng=None, broadcast_dropout: bool = True,
                         empty_rows: str = "mean"):
  """``dot_product_attention`` through the fused kernel: query [..., T, N, H], key/value
  [..., S, K, H] -> [..., T, N, H_v] (and the residual [..., T, N] with ``return_residual``);
  a query row with no key gives what ``empty_rows`` asks (``masks.EMPTY_ROWS``: "mean", jax.nn's
  answer, by default; or "zero"). Inputs are assumed validated and servable
  (attention.KERNELS); ``local_window_size`` as (left, right) or None."""
  run = lambda residual: _fused_attention(  # noqa: E731
      query, key, value, mask, scale=scale, is_causal=is_causal,
      local_window_size=local_window_size, logits_soft_cap=logits_soft_cap,
      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids, key_segment_ids=key_segment_ids,
      score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask, return_residual=residual,
      interpret=interpret, return_max_scores=return_max_scores, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout)
  return masks_lib.blockwise_empty_rows(
      run, value, empty_rows, return_residual=return_residual,
      query_seq_lengths=query_seq_lengths, structure=(
          mask, local_window_size, key_value_seq_lengths, query_segment_ids, mask_mod,
          block_mask))


def _fused_attention(query, key, value, mask, *, scale, is_causal, local_window_size,
                     logits_soft_cap, query_seq_lengths, key_value_seq_lengths,
                     query_segment_ids, key_segment_ids, score_mod, mask_mod, block_mask,
                     return_residual, interpret, return_max_scores, dropout_rate, dropout_rng,
                     broadcast_dropout):
  """``pallas_gpu_attention`` with zeros on a row with no key."""
  q_len, kv_len = query.shape[-3], key.shape[-3]
  blocks, kinds = _kernel_blocks(block_mask, BLOCK)
  mask_mod, block_mask = structure.translate(
      query.shape[:-3], q_len, kv_len, blocks, is_causal=is_causal, window=local_window_size,
      mask=mask, lengths=(query_seq_lengths, key_value_seq_lengths),
      segment_ids=(query_segment_ids, key_segment_ids),
      mask_mod=mask_mod if block_mask is None else block_mask.mask_mod, block_kinds=kinds)
  if logits_soft_cap is not None:
    inner = score_mod or (lambda score, *indices: score)
    score_mod = lambda score, *indices: inner(
        logits_soft_cap * jnp.tanh(score / logits_soft_cap), *indices)
  output, lse, *row_max = flex_attention(
      query, key, value, scale=scale, score_mod=score_mod, mask_mod=mask_mod,
      block_mask=block_mask, interpret=interpret, return_max_scores=return_max_scores,
      dropout_rate=dropout_rate, dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout)
  extras = ((lax.stop_gradient(lse),) if return_residual else ()) + tuple(row_max)
  return (output, *extras) if extras else output
