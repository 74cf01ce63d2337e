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


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False):
  """Returns (output [..., T, N, H_v], weights [..., N, T, S], cache for ``attention_vjp``)."""
  q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
  num_heads, head_dim = q.shape[-2], q.shape[-1]
  scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
  k_rep, v_rep = _repeat_heads(k, num_heads), _repeat_heads(v, num_heads)
  logits = scale * np.einsum("...tnh,...snh->...nts", q, k_rep)
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
  cache = (q, k_rep, v_rep, weights, scale, k.shape[-2],
           None if bias is None else np.shape(bias))
  return output, weights, cache


def attention_vjp(cache, d_output):
  """Gradients (d_query, d_key, d_value, d_bias) of sum(output * d_output)."""
  q, k_rep, v_rep, weights, scale, num_kv_heads, bias_shape = cache
  d_output = np.asarray(d_output, np.float64)
  d_value = np.einsum("...nts,...tnh->...snh", weights, d_output)
  d_weights = np.einsum("...tnh,...snh->...nts", d_output, v_rep)
  d_logits = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True))
  d_query = scale * np.einsum("...nts,...snh->...tnh", d_logits, k_rep)
  d_key = scale * np.einsum("...nts,...tnh->...snh", d_logits, q)
  d_bias = None if bias_shape is None else _reduce_to(d_logits, bias_shape).reshape(bias_shape)
  return (d_query, _sum_groups(d_key, num_kv_heads), _sum_groups(d_value, num_kv_heads), d_bias)
