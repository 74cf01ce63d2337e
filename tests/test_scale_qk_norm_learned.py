"""The learned-scale QK-norm variant against Henry et al.'s formula written out in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import multihead
from attention_jax import variants
from attention_jax.variants import qk_norm_learned


def test_its_maps_are_the_gain_times_the_cosines_of_queries_and_keys():
  variant = variants.get("qk_norm_learned", length=8)
  module = multihead.MultiHeadAttention(num_heads=2, qkv_features=8, head_variant=variant)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 5, 8))
  params = module.init(jax.random.PRNGKey(1), x)["params"]
  np.testing.assert_allclose(params["qk_norm_learned"]["gain"], [np.log2(56.0)], rtol=1e-6)
  q = np.einsum("btd,dnh->btnh", x, params["query"]["kernel"]) + params["query"]["bias"]
  k = np.einsum("btd,dnh->btnh", x, params["key"]["kernel"]) + params["key"]["bias"]
  q, k = (a / np.linalg.norm(a, axis=-1, keepdims=True) for a in (q, k))
  logits = np.log2(56.0) * np.einsum("btnh,bsnh->bnts", q, k)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  v = np.einsum("btd,dnh->btnh", x, params["value"]["kernel"]) + params["value"]["bias"]
  heads = np.einsum("bnts,bsnh->btnh", weights, v)
  out = np.einsum("btnh,nhd->btd", heads, params["out"]["kernel"]) + params["out"]["bias"]
  np.testing.assert_allclose(module.apply({"params": params}, x), out, rtol=1e-4, atol=1e-5)


def test_a_length_below_two_is_a_one_line_error():
  with pytest.raises(ValueError, match="length >= 2"):
    qk_norm_learned.QKNormLearned(length=1).check(num_heads=2, head_dim=4)
