"""An independent float64 NumPy reference for attention: forward and hand-written backward."""

import numpy as np


def _repeat_heads(x, num_heads):
  return np.repeat(x, num_heads // x.shape[-2], axis=-2)


def _sum_groups(x, num_kv_heads):
  """[..., S, N, H] -> [..., S, K, H], summing the N // K query heads that share a kv head."""
  *lead, length, num_heads, dim = x.shape
  return x.reshape(*lead, length, num_kv_heads, num_heads // num_kv_heads, dim).sum(-2)


def _reduce_to(x, shape):
  """Sums a broadcast gradient back to ``shape``."""
  x = x.sum(axis=tuple(range(x.ndim - len(shape))))
  return x.sum(axis=tuple(i for i, d in enumerate(shape) if d == 1), keepdims=True)


def structure_mask(q_len, kv_len, batch, *, window=None, q_lengths=None, kv_lengths=None,
                   q_segments=None, kv_segments=None):
  """[*batch, 1, T, S] bool from the jax.nn-style arguments, written out index by index."""
  allowed = np.ones(tuple(batch) + (1, q_len, kv_len), bool)
  for index in np.ndindex(*batch):
    for t in range(q_len):
      for s in range(kv_len):
        ok = True
        if window is not None:
          ok &= t - window[0] <= s <= t + window[1]
        if q_lengths is not None:
          ok &= t < np.asarray(q_lengths)[index]
        if kv_lengths is not None:
          ok &= s < np.asarray(kv_lengths)[index]
        if q_segments is not None:
          ok &= np.asarray(q_segments)[index + (t,)] == np.asarray(kv_segments)[index + (s,)]
        allowed[index + (0, t, s)] = ok
  return allowed


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              logits_soft_cap=None):
  """Returns (output [..., T, N, H_v], weights [..., N, T, S], cache for ``attention_vjp`` and
  ``log_sum_exp``)."""
  q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
  num_heads, head_dim = q.shape[-2], q.shape[-1]
  scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
  k_rep, v_rep = _repeat_heads(k, num_heads), _repeat_heads(v, num_heads)
  logits = scale * np.einsum("...tnh,...snh->...nts", q, k_rep)
  squashed = None
  if logits_soft_cap is not None:
    squashed = np.tanh(logits / logits_soft_cap)
    logits = logits_soft_cap * squashed
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  valid = np.ones(logits.shape, bool)
  if mask is not None:
    valid &= np.broadcast_to(np.asarray(mask, bool), logits.shape)
  if is_causal:
    t_len, s_len = logits.shape[-2:]
    valid &= np.arange(s_len)[None, :] <= np.arange(t_len)[:, None]
  valid &= np.isfinite(logits)
  safe = np.where(valid, logits, -np.inf)
  row_max = safe.max(-1, keepdims=True)
  row_max = np.where(np.isfinite(row_max), row_max, 0.0)
  unnormalized = np.where(valid, np.exp(np.where(valid, logits, 0.0) - row_max), 0.0)
  total = unnormalized.sum(-1, keepdims=True)
  weights = np.where(total > 0, unnormalized / np.where(total > 0, total, 1.0), 0.0)
  output = np.einsum("...nts,...snh->...tnh", weights, v_rep)
  with np.errstate(divide="ignore"):
    lse = (row_max + np.log(total))[..., 0]  # [..., N, T]; -inf where nothing is attended
  cache = (q, k_rep, v_rep, weights, scale, k.shape[-2],
           None if bias is None else np.shape(bias), squashed, lse)
  return output, weights, cache


def log_sum_exp(cache):
  """log sum_s exp(logits) over each row's attended keys: [..., T, N], -inf on empty rows."""
  return np.swapaxes(cache[-1], -1, -2)


def attention_vjp(cache, d_output):
  """Gradients (d_query, d_key, d_value, d_bias) of sum(output * d_output)."""
  q, k_rep, v_rep, weights, scale, num_kv_heads, bias_shape, squashed, _ = cache
  d_output = np.asarray(d_output, np.float64)
  d_value = np.einsum("...nts,...tnh->...snh", weights, d_output)
  d_weights = np.einsum("...tnh,...snh->...nts", d_output, v_rep)
  d_logits = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True))
  d_bias = None if bias_shape is None else _reduce_to(d_logits, bias_shape).reshape(bias_shape)
  if squashed is not None:  # through cap * tanh(z / cap)
    d_logits = d_logits * (1.0 - squashed ** 2)
  d_query = scale * np.einsum("...nts,...snh->...tnh", d_logits, k_rep)
  d_key = scale * np.einsum("...nts,...tnh->...snh", d_logits, q)
  return (d_query, _sum_groups(d_key, num_kv_heads), _sum_groups(d_value, num_kv_heads), d_bias)
