"""Trace-time validation shared by the attention functions.

Every check raises ``ValueError`` naming the argument, what was expected and what came.
"""

from __future__ import annotations

import functools
import operator
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import tangent as tangent_lib


def check_qkv(query, key, value, *, folded: bool = False) -> None:
  """Validates query [..., T, N, H], key [..., S, K, H], value [..., S, K, H_v] (``folded``:
  value [..., S, K_v, H_v], the heads a variant's weights hook folds the maps into)."""
  for name, array in (("query", query), ("key", key), ("value", value)):
    if array.ndim < 3:
      raise ValueError(
          f"{name} must have shape [..., length, heads, head_dim] (rank >= 3), "
          f"got shape {array.shape}.")
    if not jnp.issubdtype(array.dtype, jnp.floating):
      raise ValueError(f"{name} must be a floating dtype, got {array.dtype}.")
  if not query.ndim == key.ndim == value.ndim:
    raise ValueError(
        "query, key and value must have the same rank, got query "
        f"{query.shape}, key {key.shape}, value {value.shape}.")
  if not query.dtype == key.dtype == value.dtype:
    raise ValueError(
        "query, key and value must share one dtype, got "
        f"{query.dtype}, {key.dtype}, {value.dtype}; cast them first.")
  if not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
    raise ValueError(
        "query, key and value must have the same leading batch dims, got "
        f"query {query.shape}, key {key.shape}, value {value.shape}.")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(
        f"query and key must have the same head_dim (last axis), got query "
        f"{query.shape} and key {key.shape}.")
  if key.shape[-3:-1 - folded] != value.shape[-3:-1 - folded]:
    raise ValueError(
        "key and value must have the same length and number of heads "
        f"[..., S, K, :], got key {key.shape} and value {value.shape}.")
  num_heads, num_kv_heads = query.shape[-2], key.shape[-2]
  if num_heads % num_kv_heads:
    raise ValueError(
        f"query heads N={num_heads} must be a multiple of key/value heads "
        f"K={num_kv_heads} (grouped-query attention), got query {query.shape} "
        f"and key {key.shape}.")


def check_mask_and_bias(mask, bias, target: Sequence[int]) -> None:
  """Raises unless ``mask`` is boolean and ``bias`` floating, each (where given) broadcasting
  to exactly ``target``."""
  for name, array in (("mask", mask), ("bias", bias)):
    if array is None:
      continue
    if name == "mask" and array.dtype != jnp.bool_:
      raise ValueError(
          f"mask must be boolean (True = attend), got dtype {array.dtype}; "
          "pass an additive mask as bias instead.")
    if name == "bias" and not jnp.issubdtype(array.dtype, jnp.floating):
      raise ValueError(f"bias must be a floating dtype, got {array.dtype}.")
    fits = len(array.shape) <= len(target) and all(
        dim in (1, want) for dim, want in zip(array.shape[::-1], target[::-1]))
    if not fits:
      hint = ("; a per-token padding mask [..., S] becomes one with aj.padding_mask(valid), or pass "
              "the lengths as key_value_seq_lengths" if name == "mask" else "")
      raise ValueError(
          f"{name} of shape {tuple(array.shape)} does not broadcast to "
          f"[..., heads, q_len, kv_len] = {tuple(target)}{hint}.")


#: The jax.nn arguments that describe which keys each query sees, as arrays.
STRUCTURE = ("query_seq_lengths", "key_value_seq_lengths", "query_segment_ids", "key_segment_ids")


def attention_inputs(query, key, mask, bias, num_heads: int, structure: dict):
  """mask (flax's numeric masks read as nonzero = attend), bias and the STRUCTURE arguments of
  ``structure`` as arrays, validated against [..., N, T, S] -> (mask, bias, {name: array})."""
  mask = None if mask is None else jnp.asarray(mask)
  if mask is not None and mask.dtype != jnp.bool_ and jnp.issubdtype(mask.dtype, jnp.number):
    mask = mask != 0
  bias = None if bias is None else jnp.asarray(bias)
  arrays = {name: None if structure.get(name) is None else jnp.asarray(structure[name])
            for name in STRUCTURE}
  check_mask_and_bias(mask, bias, query.shape[:-3] + (num_heads, query.shape[-3], key.shape[-3]))
  check_structure(query, key, **arrays)
  return mask, bias, arrays


def dropout(rate: float, rng, deterministic: bool) -> float:
  """The dropout rate a call applies (0 when deterministic), checked: in [0, 1), with a key."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {rate}.")
  rate = 0.0 if deterministic else rate
  if rate > 0.0 and rng is None:
    raise ValueError(f"dropout_rate={rate} needs a dropout_rng (a jax.random key), or "
                     "deterministic=True.")
  return rate


def refuse_unserved(**arguments) -> None:
  """flax arguments that choose how products are computed or sharded: only None (flax's default)
  is served; anything else raises ValueError naming it, never ignored."""
  for name, value in arguments.items():
    if value is not None:
      raise ValueError(f"{name}={value!r} is not served: attention_jax computes its own products "
                       f"(dtype= and precision= choose their dtype and precision; parameters shard "
                       f"by their partitioning metadata); leave {name} unset.")


def _check_ints(name, array, shape) -> None:
  if not jnp.issubdtype(array.dtype, jnp.integer):
    raise ValueError(f"{name} must be an integer array, got dtype {array.dtype}.")
  if tuple(array.shape) != tuple(shape):
    raise ValueError(f"{name} must have shape {tuple(shape)} (the batch dims of query"
                     f"{', then the length' if len(shape) > 0 else ''}), got {array.shape}.")


def check_structure(query, key, *, query_seq_lengths, key_value_seq_lengths, query_segment_ids,
                    key_segment_ids) -> None:
  """Validates sequence lengths [...] and segment ids [..., T] / [..., S] (ints, both ids or
  neither)."""
  batch = query.shape[:-3]
  for name, array in (("query_seq_lengths", query_seq_lengths),
                      ("key_value_seq_lengths", key_value_seq_lengths)):
    if array is not None:
      _check_ints(name, array, batch)
  if (query_segment_ids is None) != (key_segment_ids is None):
    raise ValueError("query_segment_ids and key_segment_ids come together: pass both (the same "
                     "array twice for self-attention) or neither.")
  if query_segment_ids is not None:
    _check_ints("query_segment_ids", query_segment_ids, batch + query.shape[-3:-2])
    _check_ints("key_segment_ids", key_segment_ids, batch + key.shape[-3:-2])


def local_window(size) -> tuple[int, int] | None:
  """local_window_size as (left, right): an int w means (w, w); None stays None."""
  if size is None:
    return None
  try:
    window = (operator.index(size),) * 2 if not hasattr(size, "__len__") else tuple(
        operator.index(w) for w in size)
  except TypeError:
    window = ()
  if len(window) != 2 or min(window) < 0:
    raise ValueError(f"local_window_size must be a non-negative int or a (left, right) pair of "
                     f"them, got {size!r}.")
  return window


def soft_cap(cap) -> float | None:
  if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
    raise ValueError(f"logits_soft_cap must be a positive number or None, got {cap!r}.")
  return None if cap is None else float(cap)


NORMALIZERS = ("softmax", "sigmoid")


def check_custom(num_heads: int, *, sinks, normalizer, return_residual, hooks=None) -> None:
  """Validates sinks [N] (floating), the normalizer, and what sigmoid attention and a head
  variant's hooks cannot do."""
  if normalizer not in NORMALIZERS:
    raise ValueError(f"normalizer must be one of {NORMALIZERS}, got {normalizer!r}.")
  if sinks is not None:
    if tuple(sinks.shape) != (num_heads,) or not jnp.issubdtype(sinks.dtype, jnp.floating):
      raise ValueError(f"sinks must be a floating array of shape [N] = ({num_heads},) (one logit "
                       f"per query head), got {sinks.dtype}{list(sinks.shape)}.")
    if normalizer == "sigmoid":
      raise ValueError("sinks add to the softmax's denominator, and sigmoid attention has none; "
                       "pass sinks=None or normalizer=\"softmax\".")
  if normalizer == "sigmoid" and return_residual:
    raise ValueError("sigmoid attention has no log-sum-exp (nor a softmax's row maximum) to "
                     "return; pass return_residual=False (return_max_scores=False) or "
                     "normalizer=\"softmax\".")
  if hooks is not None and return_residual:
    raise ValueError("return_residual / return_max_scores: a head variant's hooks (hooks=) "
                     "change the weights after the softmax, so there is no log-sum-exp to "
                     "return; call without it.")


def reverse_only(kernel, name: str):
  """``kernel`` (a custom VJP without a tangent) as a custom JVP whose tangent is a linear map
  (``tangent.linear``) that transposes to the kernel's own backward: reverse mode runs the
  kernel's forward and backward as before, and forward mode, wherever the kernel is traced
  (inside jit, jax.checkpoint, vmap or a scan), raises one line naming the kernel that serves it
  instead of JAX's error about custom_vjp functions. The floating arrays among the arguments
  get cotangents; the rest are held fixed."""
  def run(*args, **kwargs):
    leaves, tree = jax.tree.flatten((args, kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))
             and jnp.issubdtype(leaf.dtype, jnp.inexact)]

    def call(*arrays):
      filled = list(leaves)
      for i, array in zip(slots, arrays):
        filled[i] = array
      positional, named = jax.tree.unflatten(tree, filled)
      return kernel(*positional, **named)

    message = forward_mode_refusal(name)
    refused = jax.custom_jvp(call)

    def tangent_rule(primals, tangents):
      try:
        out, pullback = jax.vjp(call, *primals)
      except TypeError as error:  # a jvp of the gradient reached the kernel's custom VJP
        if "forward-mode" not in str(error):
          raise
        raise ValueError(message) from None
      outs, out_tree = jax.tree.flatten(out)
      residuals, pullback_tree = jax.tree.flatten(pullback)
      d_outs = tangent_lib.linear(functools.partial(tangent_lib.refuse, message),
                                  functools.partial(_pull, pullback_tree, out_tree),
                                  (tuple(outs), tuple(residuals)), tuple(tangents),
                                  like=tuple(outs), second_order=message)
      return out, jax.tree.unflatten(out_tree, d_outs)
    refused.defjvp(tangent_rule)
    return refused(*(leaves[i] for i in slots))
  return run


def forward_mode_refusal(name: str) -> str:
  """The one line with which a reverse-only kernel refuses forward mode."""
  return (f"implementation={name!r} has reverse mode only (a custom VJP without a tangent): "
          "forward mode through it (jax.jvp, jax.jacfwd, jax.linearize) and second order "
          "(jax.hessian, a jvp of a grad, a grad of a jvp) are refused; use "
          "implementation='chunked', whose tangent serves them all (on a GPU, 'pallas_gpu' "
          "serves first order).")


def _pull(pullback_tree, out_tree, residuals, cotangents):
  """The kernel's backward: its VJP from the residuals it saved, applied to ``cotangents``."""
  pullback = jax.tree.unflatten(pullback_tree, residuals[1])
  return pullback(jax.tree.unflatten(out_tree, list(cotangents)))
