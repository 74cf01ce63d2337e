"""Block geometry shared by the blockwise kernels and block masks: how lengths are cut into
blocks (sizes, counts, padding), what a block holds (EMPTY, PARTIAL, FULL), and the dropout
bits every blockwise kernel regenerates per entry. Imports nothing
from attention_jax, so every kernel can build on it.

Shape letters: T query length, S key length, bq and bk the block sizes, Tp and Sp the lengths
padded to whole blocks.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

#: The kinds of block a block mask records (no pair may attend, some may, all may).
EMPTY, PARTIAL, FULL = 0, 1, 2

# The largest query and key blocks by default: causal attention, or segment ids, want short key
# blocks, so that whole blocks are skipped (docs/performance.md, "Where the defaults come from").
DEFAULT_BLOCK_Q = 1024
DEFAULT_BLOCK_K = 4096
DEFAULT_BLOCK_K_CAUSAL = 1024
#: With attention dropout, key blocks of at most this many, so that the keep mask's [bq, bk]
#: temporaries stay small (docs/performance.md, "Attention dropout in the blockwise kernel").
DEFAULT_BLOCK_K_DROPOUT = 2048
#: Under a local window narrower than the keys, square blocks of about half the keys a query
#: sees, from MIN_BLOCK_WINDOW to MAX_BLOCK_WINDOW, so that each query block meets few key blocks
#: (docs/performance.md, "Where the defaults come from").
MIN_BLOCK_WINDOW, MAX_BLOCK_WINDOW = 128, 512
#: The float32 logits of the (example, head) pairs that run side by side stay within this.
PAIR_BLOCK_BYTES = 8 << 20


def round_up(length: int, block: int) -> int:
  """``length`` rounded up to whole blocks.

  >>> round_up(100, 16)
  112
  """
  return -(-length // block) * block


def block_size(length: int, requested: int | None, default: int) -> int:
  """The requested block (at most the length, rounded to 8), or else equal blocks of at most
  ``default`` (T = 1100 gets two blocks of 552, not two of 1024).

  >>> block_size(1100, None, 1024), block_size(100, 256, 1024)
  (552, 104)
  """
  if requested:
    return min(requested, round_up(length, 8))
  num_blocks = -(-length // default)
  return round_up(-(-length // num_blocks), 8)


def block_sizes(q_len: int, kv_len: int, size: int | tuple[int, int]) -> tuple[int, int]:
  """(bq, bk) from an int or a pair, checked and rounded as ``block_size`` rounds them."""
  block_q, block_k = (size, size) if isinstance(size, int) else size
  if min(block_q, block_k) < 1:
    raise ValueError(f"block_size must be a positive int or a pair of them, got {size!r}.")
  return block_size(q_len, block_q, block_q), block_size(kv_len, block_k, block_k)


def pad_axis(array, axis: int, length: int, mode: str = "constant", broadcasts: bool = True):
  """Pads ``axis`` to ``length``, unless it has size 1 and ``broadcasts`` (a mask's or bias's
  axis that stands for every query or key); None stays None."""
  if array is None or array.shape[axis] == length or (broadcasts and array.shape[axis] == 1):
    return array
  widths = [(0, 0)] * array.ndim
  widths[axis] = (0, length - array.shape[axis])
  return jnp.pad(array, widths, mode=mode)


def block_kind(every, some) -> jax.Array:
  """int8 FULL where a block's mask allows ``every`` entry, else PARTIAL where it allows
  ``some``, else EMPTY (broadcastable booleans)."""
  return jnp.where(every, FULL, jnp.where(some, PARTIAL, EMPTY)).astype(jnp.int8)


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Static block geometry of T queries and S keys: block sizes, counts and the cutting of
  [Tp or 1, Sp or 1] masks, biases and [Lp] ids into blocks.

  >>> geometry = Geometry.create(1100, 1100)
  >>> geometry.block_q, geometry.num_q
  (552, 2)
  """
  q_len: int
  kv_len: int
  block_q: int
  block_k: int
  side_by_side: bool = True  # several (example, head) pairs per loop step (pairs_per_step)

  @classmethod
  def create(cls, q_len, kv_len, block_q=None, block_k=None, narrow_keys=False, dropout=False,
             band: int | None = None):
    """Blocks of ``block_q`` and ``block_k`` (``block_size``), else the defaults; ``narrow_keys``:
    the shorter key blocks of causal attention (or segment ids, or masking by positions);
    ``dropout``: of attention dropout; ``band``: the keys a query's window spans (left + right
    + 1), for blocks of about half that.

    >>> Geometry.create(4096, 4096, band=513).block_k  # a window of 256 on each side
    256
    """
    default_q = DEFAULT_BLOCK_Q
    default_k = (DEFAULT_BLOCK_K_CAUSAL if narrow_keys else
                 DEFAULT_BLOCK_K_DROPOUT if dropout else DEFAULT_BLOCK_K)
    if band is not None and band < kv_len:  # a power of two, MIN_ to MAX_BLOCK_WINDOW
      half = 1 << (max(band // 2, 1).bit_length() - 1)
      default_q = default_k = min(max(half, MIN_BLOCK_WINDOW), MAX_BLOCK_WINDOW)
    return cls(q_len, kv_len, block_size(q_len, block_q, default_q),
               block_size(kv_len, block_k, default_k))

  @property
  def pairs_per_step(self):
    """(example, head) pairs per loop step, as many as keep their logits within
    PAIR_BLOCK_BYTES; None for one at a time (lax.map's batch_size)."""
    pairs = PAIR_BLOCK_BYTES // (4 * self.block_q * self.block_k) if self.side_by_side else 1
    return pairs if pairs > 1 else None

  @property
  def num_q(self):
    return round_up(self.q_len, self.block_q) // self.block_q

  @property
  def num_k(self):
    return round_up(self.kv_len, self.block_k) // self.block_k

  def cut(self, array, i, j):
    """Block (i, j) of a [T' or 1, S' or 1] mask or bias; None stays None."""
    if array is None:
      return None
    if array.shape[-2] != 1:
      array = lax.dynamic_slice_in_dim(array, i * self.block_q, self.block_q, axis=-2)
    if array.shape[-1] != 1:
      array = lax.dynamic_slice_in_dim(array, j * self.block_k, self.block_k, axis=-1)
    return array

  def block_ids(self, query_ids, key_ids, i, j):
    """The [bq] and [bk] ids (segments, positions) of block (i, j)."""
    return (lax.dynamic_slice_in_dim(query_ids, i * self.block_q, self.block_q),
            lax.dynamic_slice_in_dim(key_ids, j * self.block_k, self.block_k))


def _mix(x):
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 in which every input bit changes
  each output bit with probability about 1/2."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def dropout_bits(key_data, q_idx, kv_idx):
  """uint32 bits of entry (t, s) under key_data (uint32 [2]), for uint32 index arrays [bq, 1] and
  [1, bk]: a hash of each query index and one of each key index (MurmurHash3's finaliser, once
  per row and once per column), their exclusive or multiplied by an odd constant. Two integer
  operations per entry (threefry's twenty rounds cost attention 4 to 6 times its time on a CPU);
  the product's high bits, which decide a comparison with rate * 2^32, break the exclusive or's
  rectangle structure (bits(t, s) ^ bits(t, s') ^ bits(t', s) ^ bits(t', s') = 0 without it)."""
  row = _mix(q_idx * jnp.uint32(0x9E3779B1) + key_data[0])  # [bq, 1]
  column = _mix(kv_idx * jnp.uint32(0x85EBCA77) + key_data[1])  # [1, bk]
  return (row ^ column) * jnp.uint32(0x2C1B3C6D)  # [bq, bk]


def dropout_keep(key_data, q_idx, kv_idx, rate: float):
  """Inverted dropout's mask per entry, True where kept: where ``dropout_bits`` >= rate * 2^32,
  so with probability 1 - rate (to 2^-32)."""
  threshold = jnp.uint32(min(round(rate * 2.0 ** 32), 2 ** 32 - 1))
  return dropout_bits(key_data, q_idx.astype(jnp.uint32), kv_idx.astype(jnp.uint32)) >= threshold


def dropout_scale(rate: float) -> float:
  """Inverted dropout's 1 / (1 - rate), 1 without dropout: out = scale (P * keep) V, so the
  kernels apply it once to the output and to dO instead of to every weight."""
  return 1.0 / (1.0 - rate) if rate else 1.0


def head_keys(rng, batch: int, num_heads: int, broadcast: bool) -> jax.Array:
  """uint32 [B, N, 2]: the dropout key of each (example, head), ``rng`` folded with b, then n;
  with ``broadcast`` (flax's broadcast_dropout) uint32 [1, 1, 2], ``rng``'s own for every one.
  Computed once per call, outside the kernels' loops."""
  if jnp.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  call_key = jnp.asarray(rng, jnp.uint32).reshape(-1)[-2:]  # typed or raw (PRNGKey) keys
  if broadcast:
    return call_key[None, None]
  key = jax.random.wrap_key_data(call_key)
  fold = lambda b, n: jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, b), n))
  b, n = jnp.meshgrid(jnp.arange(batch), jnp.arange(num_heads), indexing="ij")  # [B, N]
  return jax.vmap(jax.vmap(fold))(b, n)
