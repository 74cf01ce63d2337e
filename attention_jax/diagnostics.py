"""What an attention head does, measured from its logits and weights.

Shape letters: B batch dims, N heads, T queries, S keys. ``valid`` is a bool mask broadcastable to
[..., N, T, S] marking the (query, key) pairs that exist (padding excluded); statistics average
over valid queries and reduce to one number per head [N].
"""

from __future__ import annotations

import jax.numpy as jnp


def entropy(weights):
  """Softmax entropy -sum_s w_ts log w_ts per query: [..., N, T, S] -> [..., N, T] (nats).

  >>> entropy(jnp.full((1, 1, 4), 0.25))  # uniform over 4 keys: log 4
  Array([[1.3862944]], dtype=float32)
  """
  return -jnp.sum(jnp.where(weights > 0, weights * jnp.log(jnp.where(weights > 0, weights, 1)),
                            0.0), axis=-1)


def attention_distance(weights):
  """Mean distance ``|t - s|`` a query looks at, ``sum_s w_ts |t - s|``:
  [..., N, T, S] -> [..., N, T].

  >>> attention_distance(jnp.eye(3)[None])  # every query attends to itself
  Array([[0., 0., 0.]], dtype=float32)
  """
  queries, keys = weights.shape[-2:]
  distance = jnp.abs(jnp.arange(queries)[:, None] - jnp.arange(keys)[None, :])  # [T, S]
  return jnp.sum(weights * distance, axis=-1)


def diagonal_is_max(logits, valid=None):
  """Whether query t's largest logit is at key t (its own position): [..., N, T, T] -> bool.

  The "diagonal fallacy" holds that self-attention mostly attends to the token itself because
  q_t.k_t is large; this measures how often that is true.

  >>> diagonal_is_max(jnp.eye(3)[None])
  Array([[ True,  True,  True]], dtype=bool)
  """
  if valid is not None:
    logits = jnp.where(valid, logits, -jnp.inf)
  return jnp.argmax(logits, axis=-1) == jnp.arange(logits.shape[-1])


def per_head_mean(values, query_valid):
  """Average of per-query values [..., N, T] over valid queries (query_valid [..., 1|N, T]) and
  all batch dims -> [N]."""
  weight = jnp.broadcast_to(query_valid, values.shape).astype(jnp.float32)
  batch_axes = tuple(range(values.ndim - 2)) + (values.ndim - 1,)
  return jnp.sum(values * weight, axis=batch_axes) / jnp.maximum(
      jnp.sum(weight, axis=batch_axes), 1.0)


def logit_variance(logits, valid):
  """Variance of the valid logits of each head, over queries, keys and batch: [..., N, T, S] ->
  [N]. For unit-variance q, k and scale 1 it is d_k; the 1/sqrt(d_k) scale brings it to 1.

  >>> logit_variance(jnp.array([[[[1.0, -1.0]]]]), jnp.ones((1, 1, 1, 2), bool))
  Array([1.], dtype=float32)
  """
  pairs = logits.shape[:-2] + (-1,)  # [..., N, T * S]: each (query, key) pair a "query"
  valid = jnp.reshape(jnp.broadcast_to(valid, logits.shape), pairs)
  logits = jnp.where(valid, jnp.reshape(logits, pairs), 0.0)  # masked (-inf) ones: 0
  mean = per_head_mean(logits, valid)  # [N]
  return per_head_mean((logits - mean[:, None]) ** 2, valid)


def negative_weight(weights):
  """The weight a query puts below zero, sum_s min(w_ts, 0): [..., N, T, S] -> [..., N, T].
  Zero for softmax weights; talking heads and DCMHA mix heads after the softmax, so the weights
  they apply can be signed (then ``entropy`` counts only the positive ones).

  >>> negative_weight(jnp.array([[[0.75, 0.5, -0.25]]]))
  Array([[-0.25]], dtype=float32)
  """
  return jnp.sum(jnp.minimum(weights, 0.0), axis=-1)


def head_usage(gates, query_valid=None):
  """The fraction of (valid) tokens that use each head, from MoH's gates [..., T, N] (zero for a
  head a token was not routed to) -> [N].

  >>> head_usage(jnp.array([[1.0, 0.0], [1.0, 2.0]]))  # head 0 always on, head 1 for one token
  Array([1. , 0.5], dtype=float32)
  """
  used = jnp.swapaxes((gates != 0).astype(jnp.float32), -1, -2)  # [..., N, T]
  return per_head_mean(used, True if query_valid is None else query_valid[..., None, :])


def head_statistics(logits, weights, valid):
  """Per-head summary [N] of each quantity above, for logits and weights [..., N, T, S].

  ``valid`` [..., 1|N, T, S]: the pairs that exist. Returns a dict of [N] arrays: logit_variance,
  entropy, max_weight, distance, negative_weight (0 unless heads are mixed after the softmax),
  first_token_weight (the weight on key 0: a CLS token, or the first token, where attention
  sinks form), diagonal_max (fraction of queries whose own key wins).

  >>> logits = jnp.zeros((2, 4, 6, 6))  # [B, N, T, S], e.g. from MultiHeadAttention's sow
  >>> weights = jax.nn.softmax(logits)
  >>> stats = head_statistics(logits, weights, jnp.ones((1, 1, 6, 6), bool))
  >>> stats["entropy"].shape
  (4,)
  """
  query_valid = jnp.any(valid, axis=-1)  # [..., 1|N, T]
  stats = {
      "logit_variance": logit_variance(logits, valid),
      "entropy": per_head_mean(entropy(weights), query_valid),
      "max_weight": per_head_mean(jnp.max(weights, axis=-1), query_valid),
      "distance": per_head_mean(attention_distance(weights), query_valid),
      "negative_weight": per_head_mean(negative_weight(weights), query_valid),
      "first_token_weight": per_head_mean(weights[..., 0], query_valid),
  }
  if logits.shape[-1] == logits.shape[-2]:  # square: each query has a key of its own index
    stats["diagonal_max"] = per_head_mean(
        diagonal_is_max(logits, valid).astype(jnp.float32), query_valid)
  return stats
