"""Shared by the attention tests (test_attention, test_superset, test_accelerators, test_gpu): the
implementations and cases every kernel is held to, the float64 reference's numbers for a case,
and the comparison of the two."""

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
import numpy_reference
from conftest import assert_close

IMPLEMENTATIONS = ["reference", "xla", "chunked", "chunked_small_blocks", None]


def attention(*args, implementation=None, scale=None, block_q=4, block_k=3, **kwargs):
  """dot_product_attention, or chunked attention with tiny blocks so that every path runs. Rows
  with no key give zeros here (empty_rows="zero"), as the float64 reference computes them;
  tests/test_dropin.py holds the default ("mean") to flax and jax.nn."""
  if implementation == "chunked_small_blocks":
    head_dim = args[0].shape[-1]
    scale = head_dim ** -0.5 if scale is None else scale
    return aj.chunked_attention(*args, scale=scale, block_q=block_q, block_k=block_k,
                                **{"empty_rows": "zero", **kwargs})
  return aj.dot_product_attention(*args, scale=scale, implementation=implementation,
                                  **{"empty_rows": "zero", **kwargs})


def random_case(seed, batch, q_len, kv_len, num_heads, num_kv_heads, head_dim,
                 value_dim=None, mask=None, bias=None):
  rng = np.random.default_rng(seed)
  query = rng.standard_normal(batch + (q_len, num_heads, head_dim)).astype(np.float32)
  key = rng.standard_normal(batch + (kv_len, num_kv_heads, head_dim)).astype(np.float32)
  value = rng.standard_normal(
      batch + (kv_len, num_kv_heads, value_dim or head_dim)).astype(np.float32)
  target = batch + (num_heads, q_len, kv_len)
  if mask == "random":  # about 1 in 4 rows fully masked
    mask = rng.random(target) < 0.6
    mask &= (rng.random(target[:-1] + (1,)) < 0.75)
  elif mask == "structure":  # [B, 1, T, S]: a window, packed segments and key lengths, as
    # dot_product_attention hands the jax.nn-style arguments to kernels that take only a mask
    ids = np.sort(rng.integers(0, 3, size=batch + (q_len,)), axis=-1)
    mask = numpy_reference.structure_mask(
        q_len, kv_len, batch, window=(max(2, q_len // 8), 1), q_segments=ids,
        kv_segments=ids,
        kv_lengths=rng.integers(1, kv_len + 1, size=batch))
  elif mask == "padding":  # [B, 1, 1, S]; the last batch element is all padding
    lengths = rng.integers(1, kv_len + 1, size=batch)
    lengths.reshape(-1)[-1] = 0
    mask = (np.arange(kv_len) < lengths[..., None])[..., None, None, :]
  if bias == "heads":  # [N, T, S], e.g. ALiBi
    bias = rng.standard_normal((num_heads, q_len, kv_len)).astype(np.float32)
  elif bias == "full":
    bias = rng.standard_normal(target).astype(np.float32)
  elif bias == "neg_inf":  # some -inf entries and one row entirely -inf
    bias = rng.standard_normal(target).astype(np.float32)
    bias[rng.random(target) < 0.3] = -np.inf
    bias[(0,) * len(batch) + (0, 1)] = -np.inf
  return query, key, value, mask, bias


CASES = {
    # name: (batch, T, S, N, K, H, options)
    "basic": ((2,), 8, 8, 4, 4, 16, {}),
    "cross_lengths": ((2,), 5, 9, 2, 2, 8, {}),
    "no_batch_dims": ((), 6, 7, 2, 2, 8, {}),
    "two_batch_dims": ((2, 3), 4, 6, 2, 2, 8, {}),
    "gqa": ((2,), 6, 6, 8, 2, 8, {}),
    "mqa": ((2,), 6, 6, 4, 1, 8, {}),
    "padding_mask": ((3,), 7, 7, 2, 2, 8, {"mask": "padding"}),
    "fully_masked_rows": ((2,), 8, 8, 4, 2, 8, {"mask": "random"}),
    "bias_per_head": ((2,), 6, 6, 4, 4, 8, {"bias": "heads"}),
    "bias_full_and_mask": ((2,), 6, 7, 2, 2, 8, {"bias": "full", "mask": "random"}),
    "bias_neg_inf": ((2,), 6, 6, 2, 2, 8, {"bias": "neg_inf"}),
    "causal": ((2,), 8, 8, 2, 2, 8, {"is_causal": True}),
    "causal_cross": ((2,), 5, 8, 2, 2, 8, {"is_causal": True}),
    "causal_masked_gqa": ((2,), 8, 8, 4, 2, 8, {"is_causal": True, "mask": "random"}),
    "structure_mask": ((2,), 12, 12, 4, 2, 8, {"mask": "structure", "bias": "heads"}),
    "scale_one": ((2,), 6, 6, 2, 2, 16, {"scale": 1.0}),
    "scale_small": ((2,), 6, 6, 2, 2, 16, {"scale": 0.01}),
    "scale_large": ((2,), 6, 6, 2, 2, 16, {"scale": 3.0}),
}


def run_case(case, attention_fn, seed=0, dtype=np.float32):
  """Output and gradients of attention_fn(q, k, v, bias, mask, scale=, is_causal=) on a case of
  CASES' form, with the float64 reference's. The inputs are rounded to ``dtype`` first."""
  batch, q_len, kv_len, heads, kv_heads, head_dim, options = case
  options = dict(options)
  scale, is_causal = options.pop("scale", None), options.pop("is_causal", False)
  query, key, value, mask, bias = random_case(
      seed, batch, q_len, kv_len, heads, kv_heads, head_dim, **options)
  query, key, value = (np.asarray(jnp.asarray(x, dtype), np.float32) for x in (query, key, value))
  d_output = np.random.default_rng(7).standard_normal(query.shape).astype(np.float32)

  def loss(q, k, v, b):
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out = attention_fn(q, k, v, b, mask, scale=scale, is_causal=is_causal).astype(np.float32)
    return jnp.sum(out * d_output), out

  grad_args = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  grads, output = jax.jit(jax.grad(loss, argnums=grad_args, has_aux=True))(
      query, key, value, bias)
  expected, _, cache = numpy_reference.attention(query, key, value, bias, mask, scale=scale,
                                                 is_causal=is_causal)
  expected_grads = numpy_reference.attention_vjp(cache, d_output)
  return output, grads, expected, expected_grads


def assert_case_matches(results, tolerance):
  output, grads, expected, expected_grads = results
  assert_close(output, expected, tolerance, "output")
  for name, grad, expected_grad in zip(("query", "key", "value", "bias"), grads,
                                       expected_grads):
    assert_close(grad, expected_grad, tolerance, f"d_{name}")
