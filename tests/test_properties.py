"""Properties of the attention weights, checked with hypothesis over random masks and logits."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import attention_jax as aj

SHAPE = (2, 5, 2, 4)  # [B, T, N, H]; fixed so that eager ops compile once
SETTINGS = settings(max_examples=30, deadline=None)
floats = hnp.arrays(np.float32, SHAPE, elements=st.floats(-3, 3, width=32))
masks = hnp.arrays(np.bool_, (2, 2, 5, 5))


@SETTINGS
@given(query=floats, key=floats, mask=masks, is_causal=st.booleans())
def test_weight_rows_sum_to_one_or_zero_and_masked_keys_get_exactly_zero(query, key, mask,
                                                                          is_causal):
  """With empty_rows="zero" a row with no key gets zeros; with the default ("mean", as flax and
  jax.nn) it attends uniformly to every key."""
  allowed = mask & (np.tril(np.ones((5, 5), bool)) if is_causal else True)
  has_key = allowed.any(-1)
  for empty_rows in ("zero", "mean"):
    _, weights = aj.dot_product_attention(query, key, key, mask=mask, is_causal=is_causal,
                                          return_weights=True, empty_rows=empty_rows)
    weights = np.asarray(weights)
    assert np.all(weights[~allowed & has_key[..., None]] == 0.0)
    row_sums = weights.sum(-1)
    np.testing.assert_allclose(row_sums[has_key], 1.0, rtol=1e-6)
    if empty_rows == "zero":
      assert np.all(row_sums[~has_key] == 0.0)
    else:
      np.testing.assert_allclose(weights[~has_key], 0.2, rtol=1e-6)
    assert np.all(weights >= 0.0)


@SETTINGS
@given(query=floats, key=floats, value=floats, mask=masks,
       implementation=st.sampled_from(["reference", "xla", "chunked"]))
def test_output_is_a_convex_combination_of_the_values(query, key, value, mask, implementation):
  output = np.asarray(aj.dot_product_attention(query, key, value, mask=mask,
                                               implementation=implementation))
  # Every head output lies inside the [min, max] box of that head's values (or is 0).
  low = value.min(axis=1)[:, None] - 1e-5  # [B, 1, N, H]
  high = value.max(axis=1)[:, None] + 1e-5
  inside = (output >= low) & (output <= high)
  empty = ~mask.any(-1)  # [B, N, T]
  assert np.all(inside | np.transpose(empty, (0, 2, 1))[..., None])


@SETTINGS
@given(magnitude=st.floats(1e3, 3e4), seed=st.integers(0, 2**16),
       implementation=st.sampled_from(["reference", "xla", "chunked"]))
def test_bfloat16_huge_logits_with_unit_scale_stay_finite(magnitude, seed, implementation):
  rng = np.random.default_rng(seed)
  # q.k ~ magnitude: logits ~1e4 with scale=1, far beyond exp's float32 range.
  query = jnp.asarray(rng.standard_normal(SHAPE) * np.sqrt(magnitude), jnp.bfloat16)
  key = jnp.asarray(rng.standard_normal(SHAPE) * np.sqrt(magnitude), jnp.bfloat16)
  value = jnp.asarray(rng.standard_normal(SHAPE), jnp.bfloat16)
  output = aj.dot_product_attention(query, key, value, scale=1.0, implementation=implementation)
  assert output.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(output, np.float32)))
