"""Positional encodings, selected by name: none, sinusoidal, learned, randomized, rope, alibi.

Each encoding acts where it belongs: sinusoidal and learned tables are added to the token
embeddings, RoPE rotates queries and keys, ALiBi adds a distance penalty to the attention logits.
Every one is a Flax module with the same three methods, so the encoder never asks which it has:

  embed(x, deterministic)  [B, T, D] -> [B, T, D]    (identity unless added to the embeddings)
  rotate(query, key)       [B, T, N, H] each -> same (identity unless rotary)
  attention_bias(T, S)     -> [N, T, S] or None      (None unless a logit bias)
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal_encoding(length: int, dim: int, *, base: float = 10000.0):
  """The fixed encoding of :ref:`Vaswani et al. (2017) <ref-vaswani2017>`, [length, dim] float32.

  PE(pos, 2i) = sin(pos / base^(2i/dim)),  PE(pos, 2i+1) = cos(pos / base^(2i/dim)).

  >>> sinusoidal_encoding(50, 128).shape
  (50, 128)
  """
  if dim % 2:
    raise ValueError(f"sinusoidal encoding needs an even dim, got {dim}.")
  position = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  frequency = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # [D/2]
  angle = position * frequency  # [L, D/2]
  encoding = np.empty((length, dim), dtype=np.float64)
  encoding[:, 0::2], encoding[:, 1::2] = np.sin(angle), np.cos(angle)
  return jnp.asarray(encoding, dtype=jnp.float32)


def apply_rope(x, positions=None, *, base: float = 10000.0):
  """Rotary position embedding (:ref:`Su et al. 2021 <ref-su2021>`): rotate each pair (x_2i, x_2i+1)
  by pos * theta_i.

  x: [..., T, N, H] (H even); positions: [..., T] or None for 0..T-1. theta_i = base^(-2i/H).
  Then q_t . k_s depends on the positions only through t - s.

  >>> query = jnp.ones((2, 10, 4, 8))  # [B, T, N, H]
  >>> apply_rope(query).shape  # positions 0..T-1
  (2, 10, 4, 8)
  """
  length, head_dim = x.shape[-3], x.shape[-1]
  if head_dim % 2:
    raise ValueError(f"rope needs an even head_dim, got {head_dim}.")
  positions = jnp.arange(length) if positions is None else jnp.asarray(positions)
  frequency = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # [H/2]
  angle = positions[..., :, None, None].astype(jnp.float32) * frequency  # [..., T, 1, H/2]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  x_even, x_odd = x[..., 0::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
  rotated = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)  # [..., T, N, H/2, 2] -> [..., T, N, H]


def rope_transform(query, key, positions=None):
  """The ``qk_transform`` of rotary encodings: query [..., T, N, H] and key [..., T, K, H] each
  rotated by their positions (0..T-1, or ``positions`` [T] while decoding, where both are the new
  tokens').

  >>> x = jnp.ones((1, 4, 2, 8))  # [B, T, N, H]
  >>> query, key = rope_transform(x, x, positions=jnp.arange(3, 7))
  """
  return apply_rope(query, positions), apply_rope(key, positions)


def alibi_slopes(num_heads: int):
  """Head slopes of ALiBi (:ref:`Press et al. 2022 <ref-press2022>`): 2^(-8/n), 2^(-16/n), ... for n
  a power of two,
  interleaved from the next power of two otherwise. [num_heads] float32."""
  def power_of_two(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]
  closest = 2 ** math.floor(math.log2(num_heads))
  slopes = power_of_two(closest)
  slopes += power_of_two(2 * closest)[0::2][:num_heads - closest]
  return jnp.asarray(slopes, dtype=jnp.float32)


def alibi_bias(num_heads: int, q_len: int, kv_len: int | None = None):
  """Symmetric ALiBi logit bias for an encoder: ``-slope_n * |t - s|``, [N, T, S] float32.

  Under a causal mask (keys s <= t only) it is Press et al.'s causal ALiBi, ``-slope_n * (t - s)``
  on every pair attended to; their code's ``slope_n * s`` differs from it by a constant per row,
  which the softmax ignores, so both give the same weights.

  >>> from attention_jax import dot_product_attention
  >>> q = k = v = jnp.ones((2, 128, 8, 16))  # [B, T, N, H]
  >>> alibi_bias(8, 128).shape  # [N, T, S]
  (8, 128, 128)
  >>> dot_product_attention(q, k, v, bias=alibi_bias(8, 128)).shape
  (2, 128, 8, 16)
  """
  kv_len = q_len if kv_len is None else kv_len
  distance = jnp.abs(jnp.arange(q_len)[:, None] - jnp.arange(kv_len)[None, :])  # [T, S]
  return -alibi_slopes(num_heads)[:, None, None] * distance  # [N, T, S]


def randomized_positions(key, length: int, max_length: int):
  """The positions of the randomized encoding (:ref:`Ruoss et al. 2023 <ref-ruoss2023>`):
  ``length`` distinct positions drawn uniformly from 0..max_length-1, in increasing order, [length]
  int32. Trained on short inputs at positions spread over the whole range, a model has seen every
  position (and most gaps) that a longer test input will use.

  >>> randomized_positions(jax.random.key(0), 5, 100).shape
  (5,)
  """
  if length > max_length:
    raise ValueError(
        f"the randomized positional encoding draws {length} distinct positions from "
        f"max_length={max_length}; raise max_length to at least the longest input.")
  return jnp.sort(jax.random.choice(key, max_length, (length,), replace=False))


def add_randomized_sinusoidal(x, key, max_length: int):
  """x [..., T, D] plus the sinusoidal table at :func:`randomized_positions` (one draw for the
  whole batch, as Ruoss et al. do) -> [..., T, D]; ``key`` None (evaluation) is the fixed draw
  of EVALUATION_POSITIONS_SEED."""
  key = jax.random.key(EVALUATION_POSITIONS_SEED) if key is None else key
  positions = randomized_positions(key, x.shape[-2], max_length)  # [T]
  table = sinusoidal_encoding(max_length, x.shape[-1])  # [max_length, D]
  return x + table[positions].astype(x.dtype)


#: The key of the randomized encoding's positions at evaluation (``deterministic``): one fixed
#: draw per length, so that evaluations are repeatable; training draws a new one at every call.
EVALUATION_POSITIONS_SEED = 0

# A learned table starts with the RMS of the sinusoidal one, sqrt(1/2).
learned_table_init = nn.initializers.normal(stddev=math.sqrt(0.5))


def add_learned_table(x, table):
  """Adds the first T rows of a learned table [max_length, D] to x [..., T, D] -> [..., T, D].

  >>> add_learned_table(jnp.ones((2, 10, 64)), jnp.zeros((512, 64))).shape  # [B, T, D]
  (2, 10, 64)
  """
  length = x.shape[-2]
  if length > table.shape[0]:
    raise ValueError(
        f"learned positional encoding has {table.shape[0]} positions but the input has "
        f"{length}; raise max_length or use a length-free encoding such as 'sinusoidal'.")
  return x + table[:length].astype(x.dtype)


class NoPositionalEncoding(nn.Module):
  """No position information at all: self-attention is then permutation equivariant."""
  max_length: int
  num_heads: int

  def __call__(self, x):
    return self.embed(x)

  def embed(self, x, deterministic: bool = True):
    del deterministic
    return x

  def rotate(self, query, key, positions=None):
    return query, key

  def attention_bias(self, q_len, kv_len):
    return None


class SinusoidalEncoding(NoPositionalEncoding):
  """Adds the fixed sinusoidal table to the embeddings; works for any length."""

  def embed(self, x, deterministic: bool = True):
    del deterministic
    return x + sinusoidal_encoding(x.shape[-2], x.shape[-1]).astype(x.dtype)


class LearnedEncoding(NoPositionalEncoding):
  """Adds a learned [max_length, D] table, initialised with the RMS of the sinusoidal one."""

  @nn.compact
  def embed(self, x, deterministic: bool = True):
    del deterministic
    table = self.param("table", learned_table_init, (self.max_length, x.shape[-1]))
    return add_learned_table(x, table)


class RandomizedEncoding(NoPositionalEncoding):
  """Adds the sinusoidal table at sorted random positions from 0..max_length-1 (Ruoss et al.
  2023): a new draw from the "dropout" stream at every training call, a fixed one when
  ``deterministic``. ``max_length`` is the longest input to be met, at test time too."""

  def embed(self, x, deterministic: bool = True):
    key = None if deterministic else self.make_rng("dropout")
    return add_randomized_sinusoidal(x, key, self.max_length)


class RotaryEncoding(NoPositionalEncoding):
  """Rotates queries and keys by their positions (RoPE)."""

  def rotate(self, query, key, positions=None):
    return rope_transform(query, key, positions)


class ALiBiEncoding(NoPositionalEncoding):
  """Adds ``-slope * |t - s|`` to the logits of each head (ALiBi); under a causal mask, Press et
  al.'s one-sided ``-slope * (t - s)``."""

  def attention_bias(self, q_len, kv_len):
    return alibi_bias(self.num_heads, q_len, kv_len)


#: The positional encodings by name, as Linen modules.
POSITIONAL_ENCODINGS = {
    "none": NoPositionalEncoding,
    "sinusoidal": SinusoidalEncoding,
    "learned": LearnedEncoding,
    "randomized": RandomizedEncoding,
    "rope": RotaryEncoding,
    "alibi": ALiBiEncoding,
}


def positional_encoding(name: str, /, *, max_length: int, num_heads: int, **kwargs):
  """The positional-encoding module registered under ``name``.

  >>> encoding = positional_encoding("sinusoidal", max_length=512, num_heads=8)
  """
  return registered(POSITIONAL_ENCODINGS, name)(max_length=max_length, num_heads=num_heads,
                                                **kwargs)


def registered(registry: dict, name: str):
  """``registry[name]`` of a registry of positional encodings (this module's or the NNX
  twins'), or a one-line error naming the known ones."""
  if name not in registry:
    raise ValueError(f"unknown positional encoding {name!r}; known: {sorted(registry)}.")
  return registry[name]
