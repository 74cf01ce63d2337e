"""Reference scaled dot-product attention: softmax(Q K^T * scale + bias) V, as the formula reads.

Shape letters: T query length, S key/value length, N query heads, K key/value heads (N = K * G),
H head dim. Any number of leading batch dims ``...``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from attention_jax import masks as masks_lib


def compute_dtype(dtype):
  """The dtype attention logits and softmax use: at least float32."""
  return jnp.promote_types(dtype, jnp.float32)


def masked_logit(dtype):
  """The finite logit that masked entries get: -0.7 times the largest ``dtype`` number, as jax.nn
  masks. Finite, so that ``jax.debug_infs(True)`` stays quiet; far below any real logit."""
  return -0.7 * float(jnp.finfo(dtype).max)


def least_row_max(dtype):
  """The softmax subtracts max(row max, this): halfway to ``masked_logit``, so that a fully
  masked row gets exp(masked_logit - this) = 0, and below any real logit."""
  return 0.5 * masked_logit(dtype)


def residual_of(lse):
  """A log-sum-exp computed with ``least_row_max`` (that value on a row with no key) -> the
  contract's residual (-inf there: the log of an empty sum)."""
  return jnp.where(lse > least_row_max(lse.dtype), lse, -jnp.inf)


def lse_of(residual):
  """The inverse of ``residual_of``: -inf -> ``least_row_max``."""
  return jnp.maximum(residual, least_row_max(residual.dtype))


def heads_first(array):
  """[..., L, N, H] -> [..., N, L, H], and back (head-major dots are faster on XLA's CPU)."""
  return jnp.swapaxes(array, -3, -2)


def grouped_heads_first(query, num_kv_heads: int):
  """Grouped-query attention groups the queries: [..., T, N, H] -> [..., K, G, T, H], the
  G = N / K query heads that read key/value head k at [..., k, :, :, :]. Keys and values are
  never copied."""
  num_heads, head_dim = query.shape[-2:]
  grouped = jnp.reshape(query, query.shape[:-2] + (num_kv_heads, num_heads // num_kv_heads,
                                                   head_dim))  # [..., T, K, G, H]
  return jnp.moveaxis(grouped, -4, -2)


def repeat_kv_heads(array, num_heads: int):
  """[..., S, K, H] -> [..., S, N, H], key/value head k copied for query heads k*G .. k*G+G-1.
  Only for kernels that need as many key/value heads as query heads (the Pallas TPU kernel)."""
  return jnp.repeat(array, num_heads // array.shape[-2], axis=-2)


def flat_heads_first(array):
  """[..., L, N, H] -> [B, N, L, H], B the flattened batch dims: the blockwise kernels' layout."""
  return heads_first(jnp.reshape(array, (-1,) + array.shape[-3:]))


def attention_logits(query, key, *, scale: float, logits_soft_cap: float | None = None):
  """scale * Q K^T per head: query [..., T, N, H], key [..., S, K, H] -> [..., N, T, S]; with
  ``logits_soft_cap`` c, c * tanh(scale * Q K^T / c) (Gemma 2's soft-capping)."""
  num_kv_heads = key.shape[-2]
  logits = jnp.einsum("...kgth,...ksh->...kgts", grouped_heads_first(query, num_kv_heads),
                      heads_first(key), preferred_element_type=compute_dtype(query.dtype))
  logits = jnp.reshape(logits, logits.shape[:-4] + (query.shape[-2],) + logits.shape[-2:])
  logits = logits * scale  # in float32 (or wider), so a bfloat16 query loses nothing to the scale
  if logits_soft_cap is not None:
    logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
  return logits  # [..., N, T, S]


@jax.custom_jvp
def _softmax(logits):
  """Softmax over the last axis; a row of masked (or -inf) logits gives zeros (not NaN)."""
  # Such a row gets least_row_max as its max, so exp(masked - max) = 0; every other row gets its
  # true max. (Passed as `initial`, this costs XLA no extra pass over the logits.)
  row_max = jnp.max(logits, axis=-1, keepdims=True, initial=least_row_max(logits.dtype))
  unnormalized = jnp.exp(logits - row_max)  # 0 where masked
  row_sum = jnp.sum(unnormalized, axis=-1, keepdims=True)
  return unnormalized / jnp.where(row_sum == 0.0, 1.0, row_sum)


@_softmax.defjvp
def _softmax_jvp(primals, tangents):
  """d softmax = y * (d logits - <y, d logits>): one pass, and 0 on rows of zeros."""
  (logits,), (d_logits,) = primals, tangents
  weights = _softmax(logits)
  return weights, weights * (d_logits - jnp.sum(weights * d_logits, axis=-1, keepdims=True))


def mask_logits(logits, mask=None, *, is_causal: bool = False):
  """Logits [..., N, T, S] in float32 (or wider), ``masked_logit`` where ``mask`` is False or,
  with ``is_causal``, above the diagonal."""
  logits = logits.astype(compute_dtype(logits.dtype))
  if is_causal:
    mask = masks_lib.combine_masks(mask, masks_lib.causal_mask(*logits.shape[-2:]))
  return logits if mask is None else jnp.where(mask, logits, masked_logit(logits.dtype))


def attention_weights(query, key, bias=None, mask=None, *, scale: float,
                      is_causal: bool = False, logits_soft_cap: float | None = None):
  """softmax(Q K^T * scale + bias) with masking: query [..., T, N, H], key [..., S, K, H] ->
  [..., N, T, S], float32 (or wider); the other arguments as ``dot_product_attention``'s.

  >>> q, k = jnp.ones((2, 5, 4, 64)), jnp.ones((2, 7, 2, 64))  # [B, T, N, H], [B, S, K, H]
  >>> attention_weights(q, k, scale=1 / 8.0).shape  # [B, N, T, S]
  (2, 4, 5, 7)
  """
  logits = attention_logits(query, key, scale=scale, logits_soft_cap=logits_soft_cap)
  logits = logits if bias is None else logits + bias
  return logits_to_weights(logits, mask, is_causal=is_causal)


def logits_to_weights(logits, mask=None, *, is_causal: bool = False):
  """The masked (and optionally causal) softmax of logits [..., N, T, S] -> weights, same shape."""
  return _softmax(mask_logits(logits, mask, is_causal=is_causal))


def dropout_weights(weights, rate: float, rng, *, broadcast: bool = False,
                    shares_queries: bool = False):
  """Inverted dropout on attention weights [..., N, T, S]: each weight kept with probability
  1 - rate and divided by it; with ``broadcast`` one mask [T, S] for every batch entry and head;
  with ``shares_queries`` one mask [..., N, 1, S] for every query, whatever ``broadcast`` says
  (mesh-tensorflow's talking heads). The masks are flax's for the same key
  (``bernoulli(rng, 1 - rate, shape)``)."""
  keep_prob = 1.0 - rate
  shape = list(weights.shape)
  if shares_queries:
    shape[-2] = 1
  elif broadcast:
    shape[:-2] = [1] * (len(shape) - 2)
  keep = jax.random.bernoulli(rng, keep_prob, tuple(shape))
  return weights * (keep.astype(weights.dtype) / jnp.asarray(keep_prob, weights.dtype))


def apply_weights(weights, value):
  """sum_s w[n, t, s] v[s, n // G] per head, in the weights' dtype: [..., N, T, S],
  [..., S, K, H_v] -> [..., T, N, H_v]."""
  num_kv_heads = value.shape[-2]
  grouped = jnp.reshape(weights, weights.shape[:-3] + (num_kv_heads, -1) +
                        weights.shape[-2:])  # [..., K, G, T, S]
  output = jnp.einsum("...kgts,...ksh->...kgth", grouped,
                      heads_first(value).astype(weights.dtype))  # [..., K, G, T, H_v]
  output = jnp.reshape(output, output.shape[:-4] + (-1,) + output.shape[-2:])  # [..., N, T, H_v]
  return heads_first(output)  # [..., T, N, H_v]


def with_sinks(logits, sinks):
  """Logits [..., N, T, S] with one more key, the sink of each head (sinks [N]): [..., N, T,
  S + 1]. Its weight is what the softmax gives no real key."""
  column = jnp.broadcast_to(sinks.astype(logits.dtype)[:, None, None], logits.shape[:-1] + (1,))
  return jnp.concatenate([logits, column], axis=-1)


def normalize(logits, *, sinks=None, normalizer: str = "softmax", sigmoid_bias: float = 0.0):
  """Masked logits [..., N, T, S] -> weights, same shape: the softmax (with the sinks [N] in
  each row's denominator when given), or sigmoid(logits + sigmoid_bias), 0 where masked."""
  if normalizer == "sigmoid":
    return jax.nn.sigmoid(logits + sigmoid_bias)  # masked: sigmoid of a huge negative, 0
  if sinks is None:
    return _softmax(logits)
  return _softmax(with_sinks(logits, sinks))[..., :-1]


class Hooks(NamedTuple):
  """A head variant's hooks on the maps, bound to one call (``Variant.hooks(state)``): ``logits``
  [..., N', T, S] -> same, before the bias; ``weights`` [..., N', T, S] -> [..., N, T, S]
  (masked again after it; N' = N * r sub-heads, consecutive ones reading one head's mask, fold
  into N). None is the identity."""
  logits: Callable | None = None
  weights: Callable | None = None
  dropout_shares_queries: bool = False  # one dropout mask [..., N, 1, S] for every query

  def __repr__(self):
    return "Hooks(a head variant's logits and weights)"


def allowed_entries(mask, shape, *, is_causal: bool = False):
  """Where ``mask`` (broadcastable to [..., N', T, S]) and causality let a query attend, folded
  to the N heads of ``shape`` [..., N, T, S] (a head's N' / N sub-heads attend where any does)."""
  allowed = mask_logits(jnp.zeros(shape[-2:]), mask, is_causal=is_causal) == 0  # [..., N', T, S]
  heads = shape[-3] if len(shape) >= 3 else 1
  if allowed.ndim >= 3 and allowed.shape[-3] not in (1, heads):
    allowed = jnp.any(jnp.reshape(allowed, allowed.shape[:-3] + (heads, -1) + allowed.shape[-2:]),
                      axis=-3)
  return allowed


def reference_attention(query, key, value, bias=None, mask=None, *, scale: float,
                        is_causal: bool = False, logits_soft_cap: float | None = None,
                        dropout_rate: float = 0.0, dropout_rng=None,
                        broadcast_dropout: bool = False, return_weights: bool = False,
                        return_logits: bool = False, return_residual: bool = False,
                        score_mod=None, sinks=None, normalizer: str = "softmax",
                        sigmoid_bias: float = 0.0, hooks: Hooks | None = None,
                        return_max_scores: bool = False):
  """Attention(Q, K, V) = softmax(Q K^T * scale + bias) V, the formula step by step, with a head
  variant's ``hooks`` on the maps (``Hooks``; the identity by default).

  query [..., T, N', H], key [..., S, K, H], value [..., S, K, H_v] -> output [..., T, N, H_v]
  (N = N' unless the weights hook folds sub-heads), followed by the weights [..., N, T, S] if
  ``return_weights`` (before dropout), the logits [..., N', T, S] if ``return_logits`` (after
  the logits hook, the bias and the score_mod, before the mask) and the log-sum-exp of each
  row's logits [..., T, N] (float32, -inf on a row with nothing to attend to, no gradient; the
  sinks included) if ``return_residual`` and each row's largest logit [..., T, N] (the same
  way) if ``return_max_scores``. ``score_mod``: logits [..., N', T, S] -> logits;
  ``sinks`` [N'], ``normalizer`` and ``sigmoid_bias`` as ``normalize`` takes them. Inputs are
  assumed validated.
  """
  hooks = Hooks() if hooks is None else hooks
  logits = attention_logits(query, key, scale=scale, logits_soft_cap=logits_soft_cap)
  logits = logits if hooks.logits is None else hooks.logits(logits)  # [..., N', T, S]
  logits = logits if bias is None else logits + bias
  logits = logits if score_mod is None else score_mod(logits)
  masked = mask_logits(logits, mask, is_causal=is_causal)
  weights = normalize(masked, sinks=sinks, normalizer=normalizer,
                      sigmoid_bias=sigmoid_bias)  # [..., N', T, S]
  if hooks.weights is not None:  # mixed or folded, then masked again
    weights = hooks.weights(weights)  # [..., N, T, S]
    weights = jnp.where(allowed_entries(mask, weights.shape, is_causal=is_causal), weights, 0.0)
  attended = weights
  if dropout_rate > 0.0:
    attended = dropout_weights(weights, dropout_rate, dropout_rng, broadcast=broadcast_dropout,
                               shares_queries=hooks.dropout_shares_queries)
  output = apply_weights(attended, value).astype(query.dtype)  # [..., T, N, H_v]
  extras = ((weights,) if return_weights else ()) + ((logits,) if return_logits else ())
  if return_residual or return_max_scores:
    rows = masked if sinks is None else with_sinks(masked, sinks)  # [..., N, T, S (+ 1)]
    for asked, of_row in ((return_residual, jax.nn.logsumexp), (return_max_scores, jnp.max)):
      if asked:  # [..., N, T] -> [..., T, N], -inf where the row has nothing to attend to
        per_row = residual_of(of_row(rows, axis=-1))
        extras += (jax.lax.stop_gradient(jnp.swapaxes(per_row, -1, -2)),)
  return (output, *extras) if extras else output
