"""The key/value cache of autoregressive decoding: the keys and values of the tokens seen so far.

A decoder that generates one token at a time projects only the new token, appends its key and
value to the cache and attends from it to every cached position, which equals causal attention
over the whole sequence. A chunk of several tokens (a prompt) can be appended at once; it is
causal within the chunk.

Shape letters: B batch dims, L the cache's length (the longest sequence), T new tokens,
K key/value heads, H head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class KVCache(NamedTuple):
  """key [..., L, K, H], value [..., L, K, H_v], and index (int32 []): the first free position.
  (The names of flax's "cache" collection are cached_key, cached_value and cache_index.)"""
  key: jax.Array
  value: jax.Array
  index: jax.Array


def init_kv_cache(batch_shape, max_length: int, num_kv_heads: int, head_dim: int,
                  dtype=jnp.float32, value_head_dim: int | None = None) -> KVCache:
  """An empty cache for sequences of up to ``max_length`` tokens.

  >>> cache = init_kv_cache((2,), 16, 4, 8)
  >>> cache.key.shape, int(cache.index)
  ((2, 16, 4, 8), 0)
  """
  shape = tuple(batch_shape) + (max_length, num_kv_heads)
  return KVCache(jnp.zeros(shape + (head_dim,), dtype),
                 jnp.zeros(shape + (value_head_dim or head_dim,), dtype),
                 jnp.array(0, jnp.int32))


def positions(cache: KVCache, num_new: int):
  """The positions [T] of ``num_new`` tokens appended next (what RoPE rotates them by)."""
  return cache.index + jnp.arange(num_new, dtype=jnp.int32)


def append(cache: KVCache, key, value):
  """Writes key [..., T, K, H] and value [..., T, K, H_v] at the cache's index.

  Returns the new cache and the mask [T, L] (True = attend) of the T new queries: query t sees
  the cached positions up to and including its own, index + t.

  >>> cache = init_kv_cache((2,), 16, 4, 8)
  >>> cache, mask = append(cache, jnp.ones((2, 3, 4, 8)), jnp.ones((2, 3, 4, 8)))
  >>> int(cache.index), mask.shape, int(mask[0].sum()), int(mask[2].sum())
  (3, (3, 16), 1, 3)
  """
  batch_dims, max_length = cache.key.ndim - 3, cache.key.shape[-3]
  expected = cache.key.shape[:-3] + cache.key.shape[-2:]
  got = key.shape[:-3] + key.shape[-2:]
  if got != expected or value.shape[:-1] != key.shape[:-1]:
    raise ValueError(f"the new keys [..., T, K, H] must match the cache {cache.key.shape} in "
                     f"batch dims, heads and head dim, got key {key.shape} and value "
                     f"{value.shape}; initialise the cache for this batch and model.")
  num_new = key.shape[-3]
  try:  # known outside jit; under jit, a write past the end would be clamped (as in flax)
    filled = int(cache.index)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    filled = None
  if filled is not None and filled + num_new > max_length:
    raise ValueError(f"the cache holds {max_length} positions and {filled} are filled; "
                     f"{num_new} more do not fit: initialise it with a longer length.")
  zero = jnp.zeros((), cache.index.dtype)  # one index dtype, also under jax_enable_x64
  start = (zero,) * batch_dims + (cache.index, zero, zero)
  new_key = lax.dynamic_update_slice(cache.key, key.astype(cache.key.dtype), start)
  new_value = lax.dynamic_update_slice(cache.value, value.astype(cache.value.dtype), start)
  query_position = positions(cache, num_new)[:, None]  # [T, 1]
  mask = jnp.arange(max_length)[None, :] <= query_position  # [T, L]
  return KVCache(new_key, new_value, cache.index + num_new), mask
