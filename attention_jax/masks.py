"""Boolean attention masks, True = attend.

Attention masks broadcast to [..., N, T, S] (heads, query length, key length). Token-level validity
vectors are [..., L] with True for real tokens and False for padding.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp


def lengths_to_valid(lengths, max_length: int):
  """Token validity from sequence lengths: [...] int -> [..., max_length] bool.

  >>> lengths_to_valid(jnp.array([2, 3]), 4)
  Array([[ True,  True, False, False],
         [ True,  True,  True, False]], dtype=bool)
  """
  return jnp.arange(max_length) < jnp.asarray(lengths)[..., None]


def tokens_to_valid(tokens, pad_id: int = 0):
  """Token validity from token ids: [..., L] int -> [..., L] bool, False where tokens == pad_id.

  >>> tokens_to_valid(jnp.array([[5, 3, 0, 0]]))
  Array([[ True,  True, False, False]], dtype=bool)
  """
  return jnp.asarray(tokens) != pad_id


def padding_mask(key_valid, query_valid=None):
  """Attention mask from token validity.

  Args:
    key_valid: [..., S] bool, True for real key tokens.
    query_valid: optional [..., T] bool. When given, padded query rows attend to nothing (they
      then return zeros); when omitted every query row may attend to every real key.

  Returns:
    [..., 1, 1, S] bool, or [..., 1, T, S] bool when query_valid is given.

  >>> padding_mask(jnp.array([[True, True, False]])).shape
  (1, 1, 1, 3)
  """
  mask = jnp.asarray(key_valid)[..., None, None, :]  # [..., 1, 1, S]
  if query_valid is not None:
    mask = mask & jnp.asarray(query_valid)[..., None, :, None]  # [..., 1, T, S]
  return mask


def causal_mask(q_len: int, kv_len: int | None = None):
  """Causal mask [q_len, kv_len]: query t attends to keys s <= t (aligned at the top left).

  This is the convention of ``jax.nn.dot_product_attention(is_causal=True)``.

  >>> causal_mask(3).astype(int)
  Array([[1, 0, 0],
         [1, 1, 0],
         [1, 1, 1]], dtype=int32)
  """
  kv_len = q_len if kv_len is None else kv_len
  return jnp.tril(jnp.ones((q_len, kv_len), dtype=jnp.bool_))


def local_window_mask(q_len: int, kv_len: int, window: tuple[int, int]):
  """[q_len, kv_len]: query t attends to keys t - left <= s <= t + right, (left, right) = window.

  The convention of ``jax.nn.dot_product_attention(local_window_size=...)``.

  >>> local_window_mask(4, 4, (1, 0)).astype(int)
  Array([[1, 0, 0, 0],
         [1, 1, 0, 0],
         [0, 1, 1, 0],
         [0, 0, 1, 1]], dtype=int32)
  """
  offset = jnp.arange(kv_len)[None, :] - jnp.arange(q_len)[:, None]  # s - t
  return (offset >= -window[0]) & (offset <= window[1])


def segment_mask(query_segment_ids, key_segment_ids):
  """Packed sequences: [..., T] and [..., S] ids -> [..., 1, T, S], True where the ids are equal.

  >>> segment_mask(jnp.array([0, 0, 1]), jnp.array([0, 0, 1])).astype(int)[0]
  Array([[1, 1, 0],
         [1, 1, 0],
         [0, 0, 1]], dtype=int32)
  """
  return (jnp.asarray(query_segment_ids)[..., None, :, None]
          == jnp.asarray(key_segment_ids)[..., None, None, :])


def seq_lengths_mask(query_seq_lengths, key_value_seq_lengths, q_len: int, kv_len: int):
  """[...] lengths (either may be None) -> [..., 1, T, S]: query rows t < query length attend to
  keys s < key length; None when both are None.

  >>> seq_lengths_mask(jnp.array([2]), jnp.array([3]), 4, 4).shape
  (1, 1, 4, 4)
  """
  masks = []
  if query_seq_lengths is not None:
    masks.append(lengths_to_valid(query_seq_lengths, q_len)[..., None, :, None])
  if key_value_seq_lengths is not None:
    masks.append(lengths_to_valid(key_value_seq_lengths, kv_len)[..., None, None, :])
  return combine_masks(*masks)


def combine_masks(*masks):
  """Logical AND of the masks that are not None, broadcast together; None if all are None.

  >>> valid = lengths_to_valid(jnp.array([3, 4]), 4)  # [B, S]
  >>> combine_masks(padding_mask(valid), causal_mask(4), None).shape  # [B, 1, T, S]
  (2, 1, 4, 4)
  """
  masks = [jnp.asarray(m, dtype=jnp.bool_) for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


def flatten_batch(array, batch_shape, core: int = 3):
  """[..., N', T', S'] broadcastable to ``[*batch_shape, N, T, S]`` -> [B or 1, N', T', S'] (or
  any ``core`` trailing axes in place of those three).

  Flattens the batch dims into one, as kernels with a single batch axis want; a mask or bias that
  is shared across the batch stays shared (no copy per example). None stays None.
  """
  if array is None:
    return None
  array = jnp.reshape(array, (1,) * (len(batch_shape) + core - array.ndim) + array.shape)
  batch, tail = array.shape[:array.ndim - core], array.shape[array.ndim - core:]
  if all(dim == 1 for dim in batch):
    return jnp.reshape(array, (1,) + tail)
  array = jnp.broadcast_to(array, tuple(batch_shape) + tail)
  return jnp.reshape(array, (-1,) + tail)


def fold_infinite_bias(bias, mask):
  """Moves the -inf entries of an additive bias into the boolean mask: (finite bias, mask).

  Kernels that add a large negative number for masked logits turn a row of -inf biases into NaN;
  with the -inf entries as mask entries they see only finite biases. None stays None.
  """
  if bias is None:
    return None, mask
  attendable = bias > -jnp.inf
  return jnp.where(attendable, bias, 0.0), combine_masks(mask, attendable)


def rows_with_keys(mask, q_len: int, kv_len: int, *, is_causal: bool):
  """Bool [..., T or 1, N or 1]: which query rows ``mask`` (broadcastable to [..., N, T, S]) and
  causality leave at least one key; None when every row has one (no mask)."""
  if mask is None:  # causal alone never empties a row.
    return None
  if is_causal:
    mask = combine_masks(mask, causal_mask(q_len, kv_len))
  mask = jnp.reshape(mask, (1,) * (3 - mask.ndim) + mask.shape)  # at least [N', T', S']
  return jnp.swapaxes(jnp.any(mask, axis=-1), -1, -2)  # [..., N', T'] -> [..., T', N']


def zero_empty_rows(output, mask, kv_len: int, *, is_causal: bool):
  """Zeros the query rows of ``output`` [..., T, N, H] that ``mask`` (and causality) leave empty.

  For kernels that give a row with no attendable key the mean of the values (jax.nn, cuDNN, the
  Pallas kernels) rather than the zeros our contract asks for. ``mask`` broadcasts to
  [..., N, T, S] with S = kv_len; the gradient of a zeroed row is zero.
  """
  has_key = rows_with_keys(mask, output.shape[-3], kv_len, is_causal=is_causal)
  if has_key is None:
    return output
  return jnp.where(has_key[..., None], output, jnp.zeros((), output.dtype))


#: What a query row with no key to attend to returns (``empty_rows=``), the library's one default
#: first, on every path: "mean", jax.nn's and flax's answer (uniform weights: the mean of the
#: values), or "zero" (zeros and zero weights); rows past ``query_seq_lengths`` are zeros either
#: way.
EMPTY_ROWS = ("mean", "zero")


def check_empty_rows(empty_rows) -> None:
  """Refuses, in one line, an ``empty_rows`` outside EMPTY_ROWS."""
  if empty_rows not in EMPTY_ROWS:
    raise ValueError(f"empty_rows must be one of {EMPTY_ROWS}, got {empty_rows!r}.")


def fill_empty_rows(output, has_key, value, empty_rows, query_seq_lengths=None, weights=None):
  """The one place ``empty_rows`` is applied: ``output`` [..., T, N, H_v] of a kernel that gives
  zeros on a query row with no key (``has_key`` [..., T, N], see ``rows_with_keys``), with what
  ``empty_rows`` asks there (``uniform_empty_rows`` for "mean"). Returns (output, weights).

  >>> value = jnp.arange(6.0).reshape(1, 3, 1, 2)  # [B, S, K, H]
  >>> has_key = jnp.array([[[True], [False]]])  # [B, T, N]: row 1 has no key
  >>> fill_empty_rows(jnp.zeros((1, 2, 1, 2)), has_key, value, "mean")[0][0, 1, 0]
  Array([2., 3.], dtype=float32)
  """
  check_empty_rows(empty_rows)
  if empty_rows == "zero":
    return output, weights
  query_valid = (None if query_seq_lengths is None
                 else lengths_to_valid(query_seq_lengths, output.shape[-3]))
  return uniform_empty_rows(output, has_key, value, weights, query_valid)


def blockwise_empty_rows(run, value, empty_rows, *, return_residual: bool, structure,
                         query_seq_lengths=None):
  """``fill_empty_rows`` for a blockwise kernel's call ``run(return_residual)`` -> out or (out,
  lse, ``*extras``), zeros and a log-sum-exp of -inf on a row with no key. ``structure``: the
  call's arguments that can leave a row with no key (a mask, a window, key lengths, segment
  ids, a mask_mod or block mask; a causal mask alone cannot); the log-sum-exp is asked for (and
  dropped again unless ``return_residual``) only when one of them is given and ``empty_rows``
  is not "zero"."""
  check_empty_rows(empty_rows)
  if empty_rows == "zero" or all(x is None for x in structure):
    return run(return_residual)
  output, lse, *extras = run(True)
  output, _ = fill_empty_rows(output, jnp.isfinite(lse), value, empty_rows, query_seq_lengths)
  extras = [lse] * return_residual + extras
  return (output, *extras) if extras else output


def uniform_empty_rows(output, has_key, value, weights=None, query_valid=None):
  """jax.nn's and flax's answer for the query rows that have no key to attend to, given a
  kernel's zeros there: their masked logits are all equal, so the softmax is uniform and the row
  is the mean of ``value`` [..., S, K, H_v] over all S keys. ``has_key`` [..., T, N]
  (broadcastable, see ``rows_with_keys``; None: every row has one); ``weights`` [..., N, T, S]
  become uniform on those rows (None stays None); ``query_valid`` [..., T]: rows past the query
  length stay zeros, as in jax.nn. Returns (output, weights).

  >>> value = jnp.arange(6.0).reshape(1, 3, 1, 2)  # [B, S, K, H]
  >>> has_key = jnp.array([[[True], [False]]])  # [B, T, N]: row 1 has no key
  >>> output, _ = uniform_empty_rows(jnp.zeros((1, 2, 1, 2)), has_key, value)
  >>> output[0, :, 0]
  Array([[0., 0.],
         [2., 3.]], dtype=float32)
  """
  if has_key is None:
    return output, weights
  empty = ~has_key  # [..., T, N]
  if query_valid is not None:
    empty = empty & query_valid[..., :, None]
  num_heads, num_kv_heads = output.shape[-2], value.shape[-2]
  mean = jnp.mean(value.astype(jnp.promote_types(value.dtype, jnp.float32)), axis=-3)
  mean = jnp.repeat(mean, num_heads // num_kv_heads, axis=-2)  # [..., K, H_v] -> [..., N, H_v]
  output = jnp.where(empty[..., None], mean[..., None, :, :].astype(output.dtype), output)
  if weights is not None:
    uniform = jnp.asarray(1.0 / weights.shape[-1], weights.dtype)
    weights = jnp.where(jnp.swapaxes(empty, -1, -2)[..., None], uniform, weights)
  return output, weights
