"""Trace-time validation shared by the attention functions.

Every check raises ``ValueError`` naming the argument, what was expected and what came.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp


def check_qkv(query, key, value) -> None:
  """Validates query [..., T, N, H], key [..., S, K, H], value [..., S, K, H_v]."""
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
  if key.shape[-3:-1] != value.shape[-3:-1]:
    raise ValueError(
        "key and value must have the same length and number of heads "
        f"[..., S, K, :], got key {key.shape} and value {value.shape}.")
  num_heads, num_kv_heads = query.shape[-2], key.shape[-2]
  if num_heads % num_kv_heads:
    raise ValueError(
        f"query heads N={num_heads} must be a multiple of key/value heads "
        f"K={num_kv_heads} (grouped-query attention), got query {query.shape} "
        f"and key {key.shape}.")


def check_broadcastable(name: str, shape: Sequence[int],
                        target: Sequence[int]) -> None:
  """Raises unless an array of ``shape`` broadcasts to exactly ``target``."""
  fits = len(shape) <= len(target) and all(
      dim in (1, want) for dim, want in zip(shape[::-1], target[::-1]))
  if not fits:
    raise ValueError(
        f"{name} of shape {tuple(shape)} does not broadcast to "
        f"[..., heads, q_len, kv_len] = {tuple(target)}.")


def check_mask_and_bias(mask, bias, target: Sequence[int]) -> None:
  if mask is not None:
    if mask.dtype != jnp.bool_:
      raise ValueError(
          f"mask must be boolean (True = attend), got dtype {mask.dtype}; "
          "pass an additive mask as bias instead.")
    check_broadcastable("mask", mask.shape, target)
  if bias is not None:
    if not jnp.issubdtype(bias.dtype, jnp.floating):
      raise ValueError(f"bias must be a floating dtype, got {bias.dtype}.")
    check_broadcastable("bias", bias.shape, target)
