import jax.numpy as jnp
import numpy as np

import attention_jax as aj
import pytest

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick


def test_lengths_and_tokens_to_valid():
  np.testing.assert_array_equal(aj.lengths_to_valid(jnp.array([0, 2, 4]), 4),
                                [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
  np.testing.assert_array_equal(aj.tokens_to_valid(jnp.array([[5, 3, 0, 0]])), [[1, 1, 0, 0]])
  np.testing.assert_array_equal(aj.tokens_to_valid(jnp.array([[5, 3, 9]]), pad_id=9), [[1, 1, 0]])


def test_padding_mask_shapes_and_values():
  valid = jnp.array([[True, True, False], [True, False, False]])
  keys_only = aj.padding_mask(valid)
  assert keys_only.shape == (2, 1, 1, 3)
  both = aj.padding_mask(valid, valid)
  assert both.shape == (2, 1, 3, 3)
  expected = valid[:, :, None] & valid[:, None, :]
  np.testing.assert_array_equal(both[:, 0], expected)


def test_causal_mask_matches_definition():
  for q_len, kv_len in [(4, 4), (3, 5), (5, 3)]:
    mask = np.asarray(aj.causal_mask(q_len, kv_len))
    expected = [[s <= t for s in range(kv_len)] for t in range(q_len)]
    np.testing.assert_array_equal(mask, expected)


def test_combine_masks_is_and_and_skips_none():
  assert aj.combine_masks(None, None) is None
  valid = jnp.array([[True, True, False]])
  combined = aj.combine_masks(aj.padding_mask(valid), None, aj.causal_mask(3))
  assert combined.shape == (1, 1, 3, 3)
  np.testing.assert_array_equal(combined[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
