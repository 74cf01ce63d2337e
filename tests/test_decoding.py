"""Autoregressive decoding with a key/value cache (Linen and NNX): token by token, or a prompt
then tokens, equals one causal pass over the whole sequence; and the module arguments that come
with it (grouped-query heads, dropout keys, sown maps, computation dtype)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention_jax as aj
from attention_jax import kv_cache
from attention_jax import nnx as aj_nnx
from attention_jax import positional
from conftest import assert_close

B, L, D, N = 2, 9, 16, 4
X = jax.random.normal(jax.random.key(1), (B, L, D))


def _linen_decode(layer, variables, chunks):
  """Feeds the chunks [B, T_i, D] in turn; returns the outputs concatenated over T."""
  cache, outputs = variables["cache"], []
  for chunk in chunks:
    y, state = layer.apply({"params": variables["params"], "cache": cache}, chunk,
                           mutable=["cache"])
    cache = state["cache"]
    outputs.append(y)
  return jnp.concatenate(outputs, axis=1)


def _chunks(splits):
  bounds = np.cumsum([0] + list(splits))
  return [X[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("splits", [[1] * L, [4] + [1] * 5, [3, 6]])
@pytest.mark.parametrize("options", [{}, {"num_kv_heads": 2}, {"normalize_qk": True},
                                     {"qk_transform": positional.rope_transform}])
def test_linen_decoding_equals_the_causal_pass(splits, options):
  layer = aj.MultiHeadAttention(num_heads=N, decode=True, **options)
  variables = layer.init(jax.random.key(0), X)
  assert variables["cache"]["cached_key"].shape == (B, L, options.get("num_kv_heads", N), D // N)
  full = aj.MultiHeadAttention(num_heads=N, **options).apply(
      {"params": variables["params"]}, X, is_causal=True)
  assert_close(_linen_decode(layer, variables, _chunks(splits)), full, 1e-5)


@pytest.mark.parametrize("implementation", ["reference", "chunked", None])
def test_nnx_decoding_equals_the_causal_pass_under_jit(implementation):
  layer = aj_nnx.MultiHeadAttention(N, D, num_kv_heads=2, qk_transform=positional.rope_transform,
                                    implementation=implementation, rngs=nnx.Rngs(0))
  full = layer(X, is_causal=True)
  layer.init_cache(X.shape)
  step = nnx.jit(lambda module, x: module(x, decode=True))
  outputs = [step(layer, X[:, t:t + 1]) for t in range(L)]
  assert_close(jnp.concatenate(outputs, axis=1), full, 1e-5)
  assert int(layer.cache_index[...]) == L


def test_decoding_refuses_a_missing_cache_and_an_overflow_in_one_line():
  layer = aj_nnx.MultiHeadAttention(N, D, decode=True, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="call init_cache"):
    layer(X[:, :1])
  layer.init_cache((B, 2, D))
  layer(X[:, :2])
  with pytest.raises(ValueError, match="do not fit"):
    layer(X[:, :1])
  with pytest.raises(ValueError, match="must match the cache"):
    kv_cache.append(kv_cache.init_kv_cache((B,), 4, 2, 8), jnp.ones((B, 1, 4, 8)),
                    jnp.ones((B, 1, 4, 8)))


def test_one_query_against_many_cached_keys_uses_the_automatic_choice():
  """One decoding step against >= 256 cached keys: the automatic choice is chunked on CPU."""
  long = jax.random.normal(jax.random.key(2), (1, 300, D))
  layer = aj.MultiHeadAttention(num_heads=N, decode=True)
  variables = layer.init(jax.random.key(0), long)
  full = aj.MultiHeadAttention(num_heads=N, implementation="reference").apply(
      {"params": variables["params"]}, long, is_causal=True)
  prompt, state = layer.apply(variables, long[:, :299], mutable=["cache"])
  last, _ = layer.apply({"params": variables["params"], **state}, long[:, 299:],
                        mutable=["cache"])
  assert_close(jnp.concatenate([prompt, last], axis=1), full, 1e-5)


def test_grouped_query_modules_equal_the_function_on_repeated_heads():
  layer = aj.MultiHeadAttention(num_heads=N, num_kv_heads=1)
  params = layer.init(jax.random.key(0), X)["params"]
  repeated = dict(params, **{name: jax.tree.map(lambda w: jnp.repeat(w, N, axis=-2),
                                                params[name]) for name in ("key", "value")})
  assert_close(layer.apply({"params": params}, X),
               aj.MultiHeadAttention(num_heads=N).apply({"params": repeated}, X), 1e-5)
  twin = aj.nnx.load_linen_params(
      aj_nnx.MultiHeadAttention(N, D, num_kv_heads=1, rngs=nnx.Rngs(0)), params)
  assert_close(twin(X), layer.apply({"params": params}, X), 1e-6)
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    aj.MultiHeadAttention(num_heads=N, num_kv_heads=3).init(jax.random.key(0), X)
  with pytest.raises(ValueError, match="fused_qkv"):
    aj_nnx.MultiHeadAttention(N, D, num_kv_heads=2, fused_qkv=True, rngs=nnx.Rngs(0))


def test_dropout_rng_at_the_call_decides_the_dropout():
  layer = aj.MultiHeadAttention(num_heads=N, dropout_rate=0.5)
  variables = layer.init(jax.random.key(0), X, deterministic=True)
  run = lambda key, rngs=None: layer.apply(variables, X, deterministic=False, dropout_rng=key,
                                           rngs=rngs)
  first = run(jax.random.key(5), {"dropout": jax.random.key(6)})
  np.testing.assert_array_equal(first, run(jax.random.key(5), {"dropout": jax.random.key(7)}))
  assert not np.allclose(first, run(jax.random.key(8)))
  twin = aj.nnx.load_linen_params(
      aj_nnx.MultiHeadAttention(N, D, dropout_rate=0.5, rngs=nnx.Rngs(0)), variables)
  np.testing.assert_array_equal(twin(X, deterministic=False, dropout_rng=jax.random.key(5)),
                                first)


def test_sow_weights_turns_the_maps_on_and_off():
  layer = aj.MultiHeadAttention(num_heads=N)
  variables = layer.init(jax.random.key(0), X)
  _, state = layer.apply(variables, X, mutable="intermediates", sow_weights=False)
  assert "attention_weights" not in state.get("intermediates", {})
  _, state = layer.apply(variables, X, mutable="intermediates", sow_weights=True)
  assert state["intermediates"]["attention_weights"][0].shape == (B, N, L, L)
  twin = aj.nnx.load_linen_params(aj_nnx.MultiHeadAttention(N, D, rngs=nnx.Rngs(0)), variables)
  _, maps = nnx.capture(twin, nnx.Intermediate)(X, sow_weights=True)
  assert_close(maps["attention_weights"][0], state["intermediates"]["attention_weights"][0],
               1e-6)
  _, maps = nnx.capture(twin, nnx.Intermediate)(X, sow_weights=False)
  assert "attention_weights" not in maps


def test_bfloat16_computation_over_float32_parameters():
  layer = aj.MultiHeadAttention(num_heads=N, dtype=jnp.bfloat16,
                                out_kernel_init=jax.nn.initializers.zeros,
                                out_bias_init=jax.nn.initializers.ones)
  variables = layer.init(jax.random.key(0), X)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  y = layer.apply(variables, X)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y, np.float32), 1.0)  # W_O = 0, b_O = 1
  assert np.abs(variables["params"]["query"]["kernel"]).max() > 0


@pytest.mark.parametrize("precision, name", [
    (None, None), ("highest", "highest"), (jax.lax.Precision.HIGH, "high"),
    ((jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST), "highest")])
def test_precision_reaches_the_attention_products_by_name(precision, name):
  assert aj.attention.matmul_precision(precision) == name


@pytest.mark.parametrize("variant", [aj.variants.get("moh"),
                                     aj.variants.get("overlap", overlap=1)])
def test_decoding_with_head_variants_that_keep_per_head_attention(variant):
  """MoH gates each token's heads and overlapping heads widen them: both decode exactly."""
  layer = aj_nnx.MultiHeadAttention(N, D, head_variant=variant, rngs=nnx.Rngs(0))
  full = layer(X, is_causal=True)
  layer.init_cache(X.shape)
  outputs = [layer(chunk, decode=True) for chunk in _chunks([3] + [1] * (L - 3))]
  assert_close(jnp.concatenate(outputs, axis=1), full, 1e-5)
  linen = aj.MultiHeadAttention(num_heads=N, decode=True, head_variant=variant)
  variables = {"params": aj.nnx.linen_params(layer),
               "cache": linen.init(jax.random.key(0), X)["cache"]}
  assert_close(_linen_decode(linen, variables, _chunks([1] * L)), full, 1e-5)


@pytest.mark.parametrize("name", ["talking_heads", "dcmha"])
def test_decoding_refuses_the_mixing_head_variants_in_one_line(name):
  layer = aj_nnx.MultiHeadAttention(N, D, head_variant=aj.variants.get(name), rngs=nnx.Rngs(0))
  layer.init_cache(X.shape)
  with pytest.raises(ValueError, match="mixes every head's weights"):
    layer(X[:, :1], decode=True)
