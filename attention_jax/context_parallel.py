"""Context-parallel attention: the sequence axis sharded over a mesh axis of P devices, each
holding T / P queries, keys and values. Two strategies compute exact attention:

- "ring" (:ref:`Liu et al. 2023 <ref-liu2023>`): the key/value shards travel around the ring
  (``lax.ppermute``) for P steps while each device runs ``chunked``'s kernel on its query shard,
  merging partial results by their log-sum-exps; the backward pass recomputes each step and
  rotates the key/value gradients home with their shards, and the tangent (forward mode: jvp,
  jacfwd, hessian-vector products) sums each step's blockwise tangent as the key/value tangents
  travel with their shards (a custom JVP whose tangent transposes to that backward pass, as in
  ``chunked``). Memory per device is linear in T / P.
- "all_gather": every device gathers all keys and values and attends its query shard to them.
  It alone takes a bias or a general mask, rows sharded with the queries, [..., N or 1,
  T / P or 1, S]. Both take a key (padding) mask [..., 1, 1, S].

The zigzag layout (:ref:`Brandon et al. 2023 <ref-brandon2023>`) gives device i the chunks i and
2P - 1 - i of 2P, balancing causal work; ``to_zigzag`` / ``from_zigzag`` permute tokens in and
out of it. The kernel masks by the tokens' true positions, so any layout is exact.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from attention_jax import _checks
from attention_jax import blocks
from attention_jax import chunked
from attention_jax import masks as masks_lib
from attention_jax import reference
from attention_jax import tangent as tangent_lib

STRATEGIES = ("ring", "all_gather")
LAYOUTS = ("contiguous", "zigzag")

# Segment ids that no query shares: padding past a sequence length (queries, then keys).
_PAST_QUERY_LENGTH = np.iinfo(np.int32).min
_PAST_KEY_LENGTH = np.iinfo(np.int32).min + 1


def zigzag_order(length: int, num_shards: int) -> np.ndarray:
  """The positions, in zigzag layout order, of a sequence of ``length`` split over ``num_shards``:
  shard i holds chunks i and 2P - 1 - i of 2P equal chunks.

  >>> zigzag_order(8, 2).tolist()  # shard 0: chunks 0 and 3, shard 1: chunks 1 and 2
  [0, 1, 6, 7, 2, 3, 4, 5]
  """
  if length % (2 * num_shards):
    raise ValueError(f"the zigzag layout splits the sequence into 2 x {num_shards} equal chunks; "
                     f"length {length} is not a multiple of {2 * num_shards}.")
  chunks = np.arange(length).reshape(2 * num_shards, -1)
  return np.concatenate([np.concatenate([chunks[i], chunks[2 * num_shards - 1 - i]])
                         for i in range(num_shards)])


def to_zigzag(x, num_shards: int, axis: int = -3):
  """x with its ``axis`` (the sequence, by default of [..., T, N, H]) in zigzag layout order.

  >>> to_zigzag(jnp.arange(8), 2, axis=0).tolist()
  [0, 1, 6, 7, 2, 3, 4, 5]
  """
  return _take(x, zigzag_order(x.shape[axis], num_shards), axis)


def from_zigzag(x, num_shards: int, axis: int = -3):
  """The inverse of ``to_zigzag``: x back in sequence order.

  >>> x = jnp.arange(8)
  >>> from_zigzag(to_zigzag(x, 2, axis=0), 2, axis=0).tolist()
  [0, 1, 2, 3, 4, 5, 6, 7]
  """
  return _take(x, np.argsort(zigzag_order(x.shape[axis], num_shards)), axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _take(x, order, axis):
  """x[..., order, ...] along ``axis`` for a permutation ``order``, keeping the sharding of an
  array on a mesh with explicit axes (with automatic ones the compiler chooses); its tangent is
  the same permutation and its transpose the inverse one (not a scatter, which explicit sharding
  cannot place)."""
  index = (slice(None),) * (axis % x.ndim) + (order,)
  sharding = jax.typeof(x).sharding
  if any(axes is not None for axes in getattr(sharding, "spec", ())):
    return x.at[index].get(out_sharding=sharding)
  return x[index]


@_take.defjvp
def _take_jvp(order, axis, primals, tangents):
  (x,), (d_x,) = primals, tangents
  permutation = _Permutation(tuple(int(i) for i in order), axis)
  return _take(x, order, axis), tangent_lib.linear(permutation.apply, permutation.transpose,
                                                   (x,), (d_x,), like=(x,))[0]


@dataclasses.dataclass(frozen=True)
class _Permutation:
  """``_take``'s tangent (the permutation) and its transpose (the inverse permutation)."""
  order: tuple
  axis: int

  def apply(self, residuals, tangents):
    return (_take(tangents[0], np.array(self.order), self.axis),)

  def transpose(self, residuals, cotangents):
    return (_take(cotangents[0], np.argsort(self.order), self.axis),)


def shard_positions(local_length: int, axis_name, layout: str = "contiguous"):
  """The sequence positions [T / P] of this device's shard (inside ``shard_map``).

  >>> # Two devices (simulated by vmap over the axis "seq"), T = 8: chunks 0 and 3, then 1 and 2.
  >>> jax.vmap(lambda _: shard_positions(4, "seq", "zigzag"), axis_name="seq")(jnp.arange(2))
  Array([[0, 1, 6, 7],
         [2, 3, 4, 5]], dtype=int32)
  """
  index, size = lax.axis_index(axis_name), lax.axis_size(axis_name)
  if layout == "contiguous":
    return index * local_length + jnp.arange(local_length)
  return jnp.asarray(zigzag_order(local_length * size, size).reshape(size, local_length))[index]


def _merge(out, lse, new_out, new_lse):
  """Two partial softmax results (out normalised over its keys, lse -inf where it had none)
  -> the result over the union of their keys. Rows empty in both stay -inf with finite
  derivatives (second order differentiates this merge)."""
  top = jnp.maximum(lse, new_lse)
  has_key = jnp.isfinite(top)
  top = jnp.where(has_key, top, 0.0)
  old_weight, new_weight = jnp.exp(lse - top), jnp.exp(new_lse - top)  # 0 where -inf
  weight = jnp.where(has_key, old_weight + new_weight, 1.0)  # >= 1 where a row has a key
  total = jnp.where(has_key, top + jnp.log(weight), -jnp.inf)
  merged = out * old_weight[..., None] + new_out * new_weight[..., None]
  return merged / weight[..., None], total


def _rotate(tree, axis_name):
  """Every array of ``tree`` moves one device along the ring (i -> i + 1)."""
  size = lax.axis_size(axis_name)
  return lax.ppermute(tree, axis_name, [(i, (i + 1) % size) for i in range(size)])


def _passing(k, v, extras):
  """What travels around the ring: the key/value shard with its segment ids and positions."""
  return k, v, extras.kv_segments, extras.kv_positions


def _arriving(extras, passing):
  k, v, kv_segments, kv_positions = passing
  return k, v, extras._replace(kv_segments=kv_segments, kv_positions=kv_positions)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7))
def _ring(q, k, v, extras, mods, pattern, geometry, axis_name):
  return _ring_forward(q, k, v, extras, mods, pattern, geometry, axis_name)


def _ring_forward(q, k, v, extras, mods, pattern, geometry, axis_name):
  """``chunked.forward``'s (out, lse) for this device's shards of q, k and v, over the keys of
  every shard in turn. ``mods``: the score_mod's and mask_mod's constants (chunked.Mods), the
  same on every step."""

  def attend(passing):  # -> out, lse (-inf on an empty row)
    k_step, v_step, extras_step = _arriving(extras, passing)
    out, lse = chunked.forward(q, k_step, v_step, None, None, extras_step, mods, pattern,
                                geometry)
    return out, reference.residual_of(lse)

  def step(carry, _):
    out, lse, passing = carry
    passing = _rotate(passing, axis_name)
    out, lse = _merge(out, lse, *attend(passing))
    return (out, lse, passing), None

  passing = _passing(k, v, extras)
  out, lse = attend(passing)
  (out, lse, _), _ = lax.scan(step, (out, lse, passing), None,
                              length=lax.axis_size(axis_name) - 1)
  return out.astype(q.dtype), reference.lse_of(lse)


@_ring.defjvp
def _ring_jvp(pattern, geometry, axis_name, primals, tangents):
  """The tangents of out and lse as one primitive that transposes to the ring's backward pass
  (attention_jax.tangent, as chunked's kernel does)."""
  q, k, v, extras, mods = primals
  d_q, d_k, d_v, _, d_mods = tangents
  outputs = _ring(q, k, v, extras, mods, pattern, geometry, axis_name)
  ring = _RingDerivatives(pattern, geometry, axis_name)
  point = (q, k, v, chunked.trainable(mods))
  d_point = (d_q, d_k, d_v, chunked.trainable(mods, d_mods.score_consts))
  return outputs, tuple(tangent_lib.linear(ring.tangent, ring.cotangent,
                                           (point, (extras, mods, *outputs)), d_point,
                                           like=outputs, derive=ring.derive))


@dataclasses.dataclass(frozen=True)
class _RingDerivatives:
  """The ring's tangent, its transpose (the backward pass) and its outputs recomputed (for
  second order), on residuals ((q, k, v, the score_mod's trainable constants), (extras, mods,
  out, lse)): every step's blockwise tangent (or gradient) with the global out and lse, summed,
  the key/value shard and its tangent (or gradient) travelling around the ring."""
  pattern: chunked.Pattern
  geometry: chunked.Blocks
  axis_name: str

  @staticmethod
  def _inputs(point, other):
    q, k, v, trained = point
    extras, mods = other[:2]
    return q, k, v, extras, mods._replace(
        score_consts=chunked.with_trained(mods.score_consts, trained))

  def derive(self, point, other):
    return other[:2] + _ring_forward(*self._inputs(point, other), self.pattern, self.geometry,
                                     self.axis_name)

  def tangent(self, residuals, tangents):
    q, k, v, extras, mods = self._inputs(*residuals)
    out, lse = residuals[1][2:]
    d_q, d_k, d_v, d_trained = tangents
    d_mods = mods._replace(score_consts=chunked.with_trained(mods.score_consts, d_trained))

    def step(carry, _):
      d_out, d_lse, passing, d_kv = carry
      k_step, v_step, extras_step = _arriving(extras, passing)
      step_out, step_lse = chunked.tangent(q, k_step, v_step, None, None, extras_step, mods,
                                           self.pattern, self.geometry, out, lse, d_q, *d_kv,
                                           None, d_mods)
      # d out = sum over shards of (their share - their d lse * out): linear, so summed
      passing, d_kv = _rotate((passing, d_kv), self.axis_name)
      return (d_out + step_out, d_lse + step_lse, passing, d_kv), None

    like = (q, k, v, d_q, d_k, d_v, extras, mods)
    zeros = lambda x: chunked.varying_zeros(x.shape, x.dtype, *like)
    init = (zeros(out), zeros(lse), _passing(k, v, extras), (d_k, d_v))
    (d_out, d_lse, _, _), _ = lax.scan(step, init, None, length=lax.axis_size(self.axis_name))
    return d_out, d_lse

  def cotangent(self, residuals, cotangents):
    q, k, v, extras, mods = self._inputs(*residuals)
    out, lse = residuals[1][2:]
    d_out, d_lse = cotangents

    def gradients(passing):  # of this step's key/value shard, with the global out and lse
      k_step, v_step, extras_step = _arriving(extras, passing)
      d_q, d_k, d_v, _, d_mod = chunked.backward(q, k_step, v_step, None, None, extras_step,
                                                  mods, self.pattern, self.geometry, out, lse,
                                                  d_out, d_lse)
      return d_q, d_k, d_v, d_mod

    def step(carry, _):
      d_q, d_k, d_v, d_mod, passing = carry
      step_q, step_k, step_v, step_mod = gradients(passing)
      # The key/value gradients travel with their shard: after P moves they are home.
      d_k, d_v, passing = _rotate((d_k + step_k, d_v + step_v, passing), self.axis_name)
      d_mod = tuple(total + part for total, part in zip(d_mod, step_mod))  # stay on this device
      return (d_q + step_q, d_k, d_v, d_mod, passing), None

    dtype = reference.compute_dtype(out.dtype)
    like = (q, k, v, d_out, d_lse, extras, mods)
    zeros = lambda shape: chunked.varying_zeros(shape, dtype, *like)
    init = (zeros(q.shape), zeros(k.shape), zeros(v.shape),
            chunked.mod_gradient_zeros(mods, dtype),
            _passing(k, v, extras))
    (d_q, d_k, d_v, d_mod, _), _ = lax.scan(step, init, None,
                                            length=lax.axis_size(self.axis_name))
    d_mods = chunked.mods_cotangent(mods, d_mod)  # summed over the devices
    return d_q, d_k, d_v, chunked.trainable(mods, d_mods.score_consts)


def context_parallel_attention_shard(
    query, key, value, bias=None, mask=None, *, axis_name, strategy: str = "ring",
    layout: str = "contiguous", is_causal: bool = False, scale: float | None = None,
    query_seq_lengths=None, key_value_seq_lengths=None, query_segment_ids=None,
    key_segment_ids=None, local_window_size=None, logits_soft_cap: float | None = None,
    block_q: int | None = None, block_k: int | None = None, score_mod=None, mask_mod=None,
    return_residual: bool = False):
  """The per-device part of ``context_parallel_attention``, for use inside your own shard_map.
  A query row with no key gives zeros here, and a log-sum-exp of -inf (``return_residual``: its
  [..., T/P, N] after the output), from which ``context_parallel_attention`` gives what
  ``empty_rows`` asks.

  query [..., T/P, N, H], key [..., S/P, K, H], value [..., S/P, K, H_v] -> [..., T/P, N, H_v]:
  this device's shards along ``axis_name``, in ``layout`` ("contiguous" or "zigzag", see
  ``zigzag_order``); segment ids are shards too, sequence lengths are of the whole sequence.
  mask: a key mask [..., 1, 1, S/P], or (strategy "all_gather") as bias, [..., N or 1, T/P or 1,
  S]. The mods see the tokens' positions in the whole sequence.

  >>> from jax.sharding import AxisType, PartitionSpec as P
  >>> mesh = jax.make_mesh((jax.device_count(),), ("seq",), axis_types=(AxisType.Auto,))
  >>> q = k = v = jnp.ones((1, 64, 4, 8))  # [B, T, N, H], T split over the devices
  >>> attend = functools.partial(context_parallel_attention_shard, axis_name="seq",
  ...                            is_causal=True)
  >>> jax.shard_map(attend, mesh=mesh, in_specs=P(None, "seq"),
  ...               out_specs=P(None, "seq"))(q, k, v).shape
  (1, 64, 4, 8)
  """
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  _checks.check_qkv(query, key, value)
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
  mask = None if mask is None else jnp.asarray(mask)
  key_mask = None
  if mask is not None and _is_key_mask(mask):  # [..., 1, 1, S/P]: which keys are real
    key_mask, mask = jnp.broadcast_to(mask[..., 0, 0, :], query.shape[:-3] + mask.shape[-1:]), None
  _check_request(query, key, bias, mask, strategy)
  if layout == "zigzag" and query.shape[-3] % 2:
    raise ValueError(f"the zigzag layout holds two equal chunks per device; the shard length "
                     f"{query.shape[-3]} is odd.")
  _checks.check_structure(query, key, query_seq_lengths=query_seq_lengths,
                          key_value_seq_lengths=key_value_seq_lengths,
                          query_segment_ids=query_segment_ids, key_segment_ids=key_segment_ids)
  scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
  positions = shard_positions(query.shape[-3], axis_name, layout)  # [T/P]
  batch_shape = query.shape[:-3]
  q_positions = kv_positions = jnp.broadcast_to(positions, batch_shape + positions.shape)

  def segments(ids, lengths, valid, past):  # ids [..., L] (0 if None), ``past`` where not valid
    ids = jnp.zeros(q_positions.shape, jnp.int32) if ids is None else ids
    if lengths is not None:
      below = q_positions < jnp.asarray(lengths)[..., None]
      valid = below if valid is None else jnp.logical_and(valid, below)
    return ids if valid is None else jnp.where(valid, ids, past)

  q_segments = kv_segments = None  # segment ids (in pairs), and past the lengths or key mask
  if any(x is not None for x in (query_segment_ids, query_seq_lengths, key_value_seq_lengths,
                                 key_mask)):
    q_segments = segments(query_segment_ids, query_seq_lengths, None, _PAST_QUERY_LENGTH)
    kv_segments = segments(key_segment_ids, key_value_seq_lengths, key_mask, _PAST_KEY_LENGTH)

  def gather(x, axis):  # the whole sequence on every device
    return None if x is None else lax.all_gather(x, axis_name, axis=x.ndim + axis, tiled=True)

  if strategy == "all_gather":
    key, value = gather(key, -3), gather(value, -3)  # [..., S, K, H]
    kv_segments, kv_positions = gather(kv_segments, -1), gather(kv_positions, -1)
    if bias is not None or mask is not None:
      target = batch_shape + (query.shape[-2], query.shape[-3], key.shape[-3])
      _checks.check_mask_and_bias(None if mask is None else jnp.asarray(mask),
                                  None if bias is None else jnp.asarray(bias), target)
  score, allow, mods = chunked.trace_mods(score_mod, mask_mod, query, key, value, bias, mask,
                                          q_segments, kv_segments)
  pattern, geometry = chunked.plan(query, key, is_causal=is_causal,
                                   local_window_size=local_window_size,
                                   logits_soft_cap=logits_soft_cap, block_q=block_q,
                                   block_k=block_k, narrow_keys=True, score_mod=score,
                                   mask_mod=allow)
  # the kernel masks by positions, and the mods see them as their indices
  by_position = pattern.is_causal or pattern.window is not None or mods.anchor is not None
  inputs = chunked.prepare(
      query, key, value, bias, mask, scale=scale, geometry=geometry,
      segment_ids=(q_segments, kv_segments),
      positions=(q_positions, kv_positions) if by_position else (None, None), mods=mods)
  # One (example, head) pair per loop step: memory per device is what sharding is for, and
  # vmapped over pairs the ring's backward fails shard_map's check_vma (jax 0.10.2).
  geometry = dataclasses.replace(geometry, side_by_side=False)
  if strategy == "all_gather":
    out, lse = chunked.blockwise(*inputs, pattern, geometry)
  else:
    out, lse = _ring(inputs.q, inputs.k, inputs.v, inputs.extras, inputs.mods, pattern, geometry,
                     axis_name)
  return chunked.finish(out, lse, query, return_residual)


def context_parallel_attention(
    query, key, value, bias=None, mask=None, *, mesh, axis_name, strategy: str = "ring",
    is_causal: bool = False, scale: float | None = None, load_balance: bool = True,
    query_seq_lengths=None, key_value_seq_lengths=None, query_segment_ids=None,
    key_segment_ids=None, local_window_size=None, logits_soft_cap: float | None = None,
    block_q: int | None = None, block_k: int | None = None, score_mod=None, mask_mod=None,
    empty_rows: str = "mean"):
  """Self-attention over a sequence sharded along ``axis_name`` of ``mesh``.

  query [..., T, N, H], key [..., T, K, H], value [..., T, K, H_v], global arrays -> [..., T, N,
  H_v], sharded the same way; the other mesh axes are left to the compiler. The sequence is
  padded inside to a multiple of P (2P in the zigzag layout). The arguments mean what they mean
  for ``dot_product_attention`` (``empty_rows`` too: "mean", jax.nn's answer on a row with no
  key, by default); a general bias or mask needs strategy="all_gather". The mods
  see positions in the whole sequence. ``load_balance`` runs causal and windowed attention in
  the zigzag layout (keep activations in ``to_zigzag`` order and call
  ``context_parallel_attention_shard(layout="zigzag")`` to save the two permutations).

  >>> mesh = jax.make_mesh((jax.device_count(),), ("seq",))  # e.g. 8 devices
  >>> q = jnp.ones((1, 64, 8, 16))  # [B, T, N, H]
  >>> k = v = jnp.ones((1, 64, 2, 16))  # [B, S, K, H]: grouped-query
  >>> context_parallel_attention(q, k, v, mesh=mesh, axis_name="seq", is_causal=True).shape
  (1, 64, 8, 16)
  """
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  _checks.check_qkv(query, key, value)
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}.")
  size = mesh.shape[axis_name]
  zigzag = load_balance and (is_causal or local_window_size is not None) and size > 1
  length, chunks = query.shape[-3], 2 * size if zigzag else size
  along = lambda x: None if x is None else jnp.asarray(x)
  (bias, mask, query_seq_lengths, key_value_seq_lengths, query_segment_ids,
   key_segment_ids) = map(along, (bias, mask, query_seq_lengths, key_value_seq_lengths,
                                  query_segment_ids, key_segment_ids))
  general_mask = None if mask is None or _is_key_mask(mask) else mask
  _check_request(query, key, bias, general_mask, strategy)
  run = functools.partial(
      _sharded, query, key, value, bias, mask, mesh=mesh, axis_name=axis_name,
      strategy=strategy, is_causal=is_causal, scale=scale, zigzag=zigzag, chunks=chunks,
      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids, key_segment_ids=key_segment_ids,
      local_window_size=local_window_size, logits_soft_cap=logits_soft_cap, block_q=block_q,
      block_k=block_k, score_mod=score_mod, mask_mod=mask_mod)
  return masks_lib.blockwise_empty_rows(
      run, value, empty_rows, return_residual=False, query_seq_lengths=query_seq_lengths,
      structure=(mask, key_value_seq_lengths, query_segment_ids, local_window_size, mask_mod))


def _sharded(query, key, value, bias, mask, return_residual, *, mesh, axis_name, strategy,
             is_causal, scale, zigzag, chunks, query_seq_lengths, key_value_seq_lengths,
             query_segment_ids, key_segment_ids, local_window_size, logits_soft_cap, block_q,
             block_k, score_mod, mask_mod):
  """``context_parallel_attention`` with zeros on a row with no key (and, ``return_residual``,
  the log-sum-exp [..., T, N], -inf there)."""
  size, length = mesh.shape[axis_name], query.shape[-3]
  padding = -length % chunks
  if padding:  # to whole chunks; the padded keys are past every sequence length
    if key_value_seq_lengths is None:
      key_value_seq_lengths = jnp.full(query.shape[:-3], length, jnp.int32)
    padded = length + padding
    query, key, value = (blocks.pad_axis(x, -3, padded) for x in (query, key, value))
    query_segment_ids, key_segment_ids = (blocks.pad_axis(x, -1, padded)
                                          for x in (query_segment_ids, key_segment_ids))
    bias, mask = (blocks.pad_axis(blocks.pad_axis(x, -2, padded), -1, padded)
                  for x in (bias, mask))
  if zigzag:  # tokens, segment ids, and the rows and columns of a bias or mask
    query, key, value = (to_zigzag(x, size) for x in (query, key, value))
    query_segment_ids, key_segment_ids = (None if x is None else to_zigzag(x, size, axis=-1)
                                          for x in (query_segment_ids, key_segment_ids))
    bias, mask = (None if x is None else _permute_logits(x, size) for x in (bias, mask))

  def spec(x, sequence_axis):  # shard the sequence axis (if any), leave the rest to the compiler
    if sequence_axis is None:
      return PartitionSpec()
    axes = [None] * x.ndim
    if x.shape[sequence_axis] != 1:
      axes[sequence_axis] = axis_name
    return PartitionSpec(*axes)

  arrays = {"query": (query, -3), "key": (key, -3), "value": (value, -3), "bias": (bias, -2),
            "mask": (mask, -1 if mask is not None and _is_key_mask(mask) else -2),
            "query_seq_lengths": (query_seq_lengths, None),
            "key_value_seq_lengths": (key_value_seq_lengths, None),
            "query_segment_ids": (query_segment_ids, -1), "key_segment_ids": (key_segment_ids, -1)}
  specs = {name: spec(x, axis) for name, (x, axis) in arrays.items() if x is not None}
  arrays = {name: _onto(arrays[name][0], specs[name], mesh) for name in specs}
  per_device = functools.partial(
      context_parallel_attention_shard, axis_name=axis_name, strategy=strategy,
      layout="zigzag" if zigzag else "contiguous", is_causal=is_causal, scale=scale,
      local_window_size=local_window_size, logits_soft_cap=logits_soft_cap, block_q=block_q,
      block_k=block_k, score_mod=score_mod, mask_mod=mask_mod, return_residual=return_residual)
  rows = PartitionSpec(*[None] * (query.ndim - 3), axis_name, None)  # the lse [..., T, N]
  # check_vma off: under vmap, the batching rule of lax.cond (the kernel's block skipping) mixes
  # device-varying and device-invariant values (jax 0.10.2), which the check rejects.
  outs = jax.shard_map(lambda kwargs: per_device(**kwargs), mesh=mesh, in_specs=(specs,),
                       out_specs=(spec(query, -3), rows) if return_residual else spec(query, -3),
                       axis_names={axis_name}, check_vma=False)(arrays)
  outs = outs if return_residual else (outs,)
  cut = []
  for x, axis in zip(outs, (-3, -2)):
    if padding:  # the padded length is whole shards, the caller's need not be: gathered first
      x = _onto(x, PartitionSpec(), mesh)
    x = from_zigzag(x, size, axis=axis) if zigzag else x
    cut.append(jax.lax.slice_in_dim(x, 0, length, axis=x.ndim + axis))
  return tuple(cut) if return_residual else cut[0]


def _onto(x, spec, mesh):
  """x resharded to ``spec`` on a mesh with explicit axes (shard_map takes inputs as placed);
  its other explicit axes are replicated, so automatic axes keep the batch sharded."""
  if not any(str(kind).endswith("Explicit") for kind in getattr(mesh, "axis_types", ())):
    return x
  return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, spec))


#: The kernel every device runs, which ``implementation=`` may name.
IMPLEMENTATION = "chunked"


def check_request(*, strategy: str = "ring", implementation: str | None = None,
                  per_row: bool = False, dropout_rate: float = 0.0, returns=(), custom=(),
                  empty_rows: str = "mean") -> None:
  """Raises ValueError, in one line, for what context-parallel attention does not serve; every
  refusal of ``ContextParallel`` and ``context_parallel_attention`` is stated here (a run
  config's check calls it too).

  ``per_row``: a bias or a mask over query rows ([..., T, S], not only over keys); ``returns``:
  the names of what is asked back beside the output (``"return_residual"``, ...); ``custom``:
  the names of the custom arguments set (``"sinks"``, ``"hooks"``, ...).

  >>> check_request(strategy="all_gather", per_row=True)  # served: None
  >>> check_request(implementation="xla")
  Traceback (most recent call last):
  ...
  ValueError: context-parallel attention runs the chunked kernel on every device; ...
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
  if implementation not in (None, IMPLEMENTATION):
    raise ValueError(f"context-parallel attention runs the {IMPLEMENTATION} kernel on every "
                     f"device; implementation={implementation!r} is not served, use "
                     f"implementation=None or {IMPLEMENTATION!r}.")
  masks_lib.check_empty_rows(empty_rows)
  if custom:
    raise ValueError(f"context-parallel attention does not serve {', '.join(custom)}; pass a "
                     "mask as a mask_mod (the ring evaluates it on every block), or call "
                     "dot_product_attention on one device.")
  if dropout_rate:
    raise ValueError("context-parallel attention has no attention dropout; set the attention "
                     "dropout rate to 0.")
  if returns:
    raise ValueError(f"context-parallel attention returns neither weights nor the log-sum-exp "
                     f"nor row maxima ({', '.join(returns)} asked); take the maps "
                     "(attention_maps) or the rows' statistics from dot_product_attention on "
                     "one device.")
  if strategy == "ring" and per_row:
    raise ValueError("strategy='ring' takes no bias, and a mask only over keys ([..., 1, 1, S]): "
                     "each device would need its [T/P, S] rows; use sequence lengths or segment "
                     "ids, or strategy='all_gather'.")


def _check_request(query, key, bias, mask, strategy):
  """``check_request`` for the arrays of a call (``mask``: what is left after a key mask has
  been taken out), and self-attention's one length."""
  check_request(strategy=strategy, per_row=bias is not None or mask is not None)
  if query.shape[-3] != key.shape[-3]:
    raise ValueError(f"context-parallel attention is self-attention over one sharded sequence: "
                     f"query and key shards must have one length, got {query.shape} and "
                     f"{key.shape}.")


def _is_key_mask(mask):
  """Whether a mask [..., N or 1, T or 1, S] only says which keys are real ([..., 1, 1, S])."""
  return mask.ndim >= 2 and mask.shape[-2] == 1 and (mask.ndim == 2 or mask.shape[-3] == 1)


def _permute_logits(x, size):
  """A bias or mask [..., T or 1, S or 1] with its rows and columns in zigzag order."""
  for axis in (-2, -1):
    if x.ndim >= -axis and x.shape[axis] != 1:
      x = to_zigzag(x, size, axis=axis)
  return x


@dataclasses.dataclass(frozen=True)
class ContextParallel:
  """``dot_product_attention``'s signature, run by ``context_parallel_attention`` over
  ``axis_name`` of ``mesh``: an ``attention_fn`` for MultiHeadAttention (and EncoderConfig).
  ``implementation``: None or "chunked", the kernel every device runs. Refused in one line
  (``check_request``): another implementation, attention dropout, returned weights, logits,
  log-sum-exp or row maxima, block masks, sinks, hooks and sigmoid attention; a row with no key
  gives what ``empty_rows`` asks, as on one device ("mean", jax.nn's answer, by default).

  >>> from attention_jax import MultiHeadAttention
  >>> mesh = jax.make_mesh((jax.device_count(),), ("seq",))
  >>> layer = MultiHeadAttention(num_heads=4, attention_fn=ContextParallel(mesh, "seq"))
  >>> x = jnp.ones((1, 32, 16))  # [B, T, D_in]
  >>> layer.apply(layer.init(jax.random.key(0), x), x).shape
  (1, 32, 16)
  """
  mesh: jax.sharding.Mesh
  axis_name: str
  strategy: str = "ring"
  load_balance: bool = True

  def __call__(self, query, key, value, bias=None, mask=None, *, dropout_rate=0.0,
               dropout_rng=None, implementation=None, dtype=None, precision=None,
               empty_rows="mean", **options):
    del dropout_rng, precision  # the chunked kernel runs on every device
    returns = [name for name in ("return_weights", "return_logits", "return_residual",
                                 "return_max_scores") if options.pop(name, False)]
    custom = [name for name in ("block_mask", "sinks", "hooks")
              if options.pop(name, None) is not None]
    custom += ["normalizer"] * (options.pop("normalizer", "softmax") != "softmax")
    options.pop("sigmoid_bias", None)
    check_request(strategy=self.strategy, implementation=implementation, dropout_rate=dropout_rate,
                  returns=returns, custom=custom, empty_rows=empty_rows)
    if dtype is not None:
      query, key, value = (x.astype(dtype) for x in (query, key, value))
    return context_parallel_attention(query, key, value, bias, mask, mesh=self.mesh,
                                      axis_name=self.axis_name, strategy=self.strategy,
                                      load_balance=self.load_balance, empty_rows=empty_rows,
                                      **options)
