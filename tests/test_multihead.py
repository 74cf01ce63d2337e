"""Multi-head attention vs flax.linen and a per-head NumPy reference; scale, weights, hooks."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
import numpy_reference
from conftest import assert_close

EMBED, D_MODEL, HEADS = 128, 256, 8  # input width differs from d_model; d_k = 32


def _inputs(seed=0, shape=(2, 7, EMBED)):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _init(layer, *inputs, **kwargs):
  variables = layer.init(jax.random.key(1), *inputs, **kwargs)
  # Non-zero biases so that a misplaced bias cannot hide.
  return jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape),
                      variables)


def _layer_norm_numpy(x, scale, epsilon=1e-6):
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + epsilon) * scale


def per_head_numpy(params, x_q, x_kv, mask=None, scale=None):
  """Concat(head_1, ..., head_N) W_O with head_n = Attention(X W_Q^n, X W_K^n, X W_V^n), the
  queries and keys layer-normalised per head when params hold query_ln/key_ln (QK-norm)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x_q, x_kv = np.asarray(x_q, np.float64), np.asarray(x_kv, np.float64)
  heads = []
  for n in range(p["query"]["kernel"].shape[1]):
    q = x_q @ p["query"]["kernel"][:, n] + p["query"]["bias"][n]  # [B, T, d_k]
    k = x_kv @ p["key"]["kernel"][:, n] + p["key"]["bias"][n]
    v = x_kv @ p["value"]["kernel"][:, n] + p["value"]["bias"][n]
    if "query_ln" in p:
      q = _layer_norm_numpy(q, p["query_ln"]["scale"])
      k = _layer_norm_numpy(k, p["key_ln"]["scale"])
    head_mask = None if mask is None else mask[:, 0]
    out, _, _ = numpy_reference.attention(q[:, :, None], k[:, :, None], v[:, :, None],
                                          mask=None if head_mask is None else head_mask[:, None],
                                          scale=scale)
    heads.append(out[:, :, 0])
  concat = np.concatenate(heads, axis=-1)  # [B, T, N * d_k]
  w_out = p["out"]["kernel"].reshape(-1, p["out"]["kernel"].shape[-1])  # [N * d_k, D_out]
  return concat @ w_out + p["out"]["bias"]


@pytest.mark.parametrize("implementation", ["reference", "xla"])
@pytest.mark.parametrize("cross", [False, True])
def test_equals_flax_multi_head_dot_product_attention_with_the_same_weights(implementation,
                                                                            cross):
  x_q = _inputs(0)
  x_kv = _inputs(1, (2, 9, EMBED)) if cross else x_q
  valid = jnp.arange(x_kv.shape[1]) < jnp.array([[x_kv.shape[1]], [4]])  # [B, S]
  mask = aj.padding_mask(valid)  # [B, 1, 1, S]
  ours = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, implementation=implementation)
  variables = _init(ours, x_q, x_kv, mask=mask)
  theirs = nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=D_MODEL,
                                           out_features=EMBED)
  expected = theirs.apply(variables, x_q, x_kv, x_kv, mask=mask)
  actual = ours.apply(variables, x_q, x_kv, mask=mask)
  assert actual.shape == (2, 7, EMBED)
  assert_close(actual, expected, 1e-5)
  assert_close(actual, per_head_numpy(variables["params"], x_q, x_kv, np.asarray(mask)), 1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_qk_norm_equals_flax_normalize_qk_and_a_per_head_layer_norm(cross):
  x_q = _inputs(0)
  x_kv = _inputs(1, (2, 9, EMBED)) if cross else x_q
  ours = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, normalize_qk=True)
  variables = _init(ours, x_q, x_kv)  # the LayerNorm scales are perturbed away from 1 too
  assert variables["params"]["query_ln"]["scale"].shape == (D_MODEL // HEADS,)
  theirs = nn.MultiHeadDotProductAttention(num_heads=HEADS, qkv_features=D_MODEL,
                                           out_features=EMBED, normalize_qk=True)
  assert (jax.tree.structure(theirs.init(jax.random.key(0), x_q, x_kv))
          == jax.tree.structure(variables))
  actual = ours.apply(variables, x_q, x_kv)
  assert_close(actual, theirs.apply(variables, x_q, x_kv, x_kv), 1e-5)
  assert_close(actual, per_head_numpy(variables["params"], x_q, x_kv), 1e-5)
  # Normalised queries and keys have norm sqrt(H) * scale per head, so at the initial scale of 1
  # every logit lies within [-sqrt(H), sqrt(H)] after the 1/sqrt(H) scaling, whatever the input.
  fresh = ours.init(jax.random.key(1), 100.0 * x_q, 100.0 * x_kv)["params"]
  logits = aj.multi_head_attention_logits(fresh, 100.0 * x_q, 100.0 * x_kv)
  assert float(jnp.max(jnp.abs(logits))) <= np.sqrt(D_MODEL // HEADS) * (1 + 1e-5)


@pytest.mark.parametrize("scale, value", [("inv_sqrt", 32 ** -0.5), ("none", 1.0),
                                          ("inv", 1 / 32), (0.3, 0.3)])
def test_scale_names_mean_what_they_say(scale, value):
  x = _inputs(2, (2, 5, EMBED)) * 0.2
  layer = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, scale=scale)
  variables = _init(layer, x)
  assert_close(layer.apply(variables, x),
               per_head_numpy(variables["params"], x, x, scale=value), 1e-5)


def test_learned_scale_starts_at_inv_sqrt_and_learns():
  x = _inputs(3, (2, 5, EMBED))
  learned = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, scale="learned")
  variables = learned.init(jax.random.key(0), x)
  temperature = variables["params"]["temperature"]
  np.testing.assert_allclose(temperature, np.full(HEADS, 32 ** -0.5), rtol=1e-7)
  fixed = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL)
  fixed_params = {k: v for k, v in variables["params"].items() if k != "temperature"}
  assert_close(learned.apply(variables, x), fixed.apply({"params": fixed_params}, x), 1e-6)
  grad = jax.grad(lambda v: jnp.sum(learned.apply(v, x) ** 2))(variables)
  assert np.all(np.abs(grad["params"]["temperature"]) > 0)


def test_sown_weights_leave_the_output_bit_identical():
  x = _inputs(4)
  mask = aj.padding_mask(jnp.array([[True] * 7, [True] * 3 + [False] * 4]))
  for implementation in ["xla", "reference"]:
    layer = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL,
                                  implementation=implementation)
    variables = _init(layer, x, mask=mask)
    plain = layer.apply(variables, x, mask=mask)
    captured, state = layer.apply(variables, x, mask=mask, mutable="intermediates",
                                  sow_weights=True)
    np.testing.assert_array_equal(plain, captured)
    (weights,) = state["intermediates"]["attention_weights"]
    assert weights.shape == (2, HEADS, 7, 7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert np.all(weights[1, :, :, 3:] == 0.0)
    _, returned = aj.multi_head_attention(variables["params"], x, mask=mask,
                                          return_weights=True)
    assert_close(weights, returned, 1e-6)
    (logits,) = state["intermediates"]["attention_logits"]  # what the softmax saw
    assert_close(jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), -1), weights, 1e-6)


@pytest.mark.parametrize("num_heads", [1, 4, 16])
def test_initialisation_equals_flax_for_any_head_count(num_heads):
  """Kernels are drawn as [D_in, N*H] matrices like flax's DenseGeneral, so the initial scale of
  q . k does not shrink as the heads get more numerous (fan-in is D_in, not N * D_in)."""
  x = _inputs(5, (2, 5, 64))
  ours = aj.MultiHeadAttention(num_heads=num_heads).init(jax.random.key(3), x)["params"]
  theirs = nn.MultiHeadDotProductAttention(num_heads=num_heads).init(jax.random.key(3), x)
  jax.tree.map(np.testing.assert_array_equal, ours, theirs["params"])


def test_attention_dropout_uses_the_dropout_rng():
  x = _inputs(5)
  layer = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, dropout_rate=0.3)
  variables = _init(layer, x, deterministic=True)
  no_dropout = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL).apply(variables, x)
  np.testing.assert_array_equal(layer.apply(variables, x, deterministic=True), no_dropout)
  run = lambda seed: layer.apply(variables, x, deterministic=False,
                                 rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.allclose(run(0), run(1))
  assert not np.allclose(run(0), no_dropout)


def test_fused_qkv_equals_separate_projections():
  x = _inputs(6)
  separate = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL)
  variables = _init(separate, x)
  p = variables["params"]
  fused_params = {
      "qkv": {"kernel": jnp.stack([p[n]["kernel"] for n in ("query", "key", "value")], axis=1),
              "bias": jnp.stack([p[n]["bias"] for n in ("query", "key", "value")], axis=0)},
      "out": p["out"]}
  fused = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, fused_qkv=True)
  assert jax.tree.map(jnp.shape, fused.init(jax.random.key(0), x)["params"]) == \
      jax.tree.map(jnp.shape, fused_params)
  assert_close(fused.apply({"params": fused_params}, x), separate.apply(variables, x), 1e-6)


def test_qk_transform_hook_acts_on_projected_queries_and_keys():
  x = _inputs(7)
  rope = lambda q, k: (aj.apply_rope(q), aj.apply_rope(k))
  plain = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL)
  rotary = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL, qk_transform=rope)
  variables = _init(plain, x)
  out = rotary.apply(variables, x)
  assert not np.allclose(out, plain.apply(variables, x))
  q, k, v, scale = aj.multihead.attention_inputs(variables["params"], x)
  expected = aj.multihead.project_out(
      variables["params"],
      aj.dot_product_attention(aj.apply_rope(q), aj.apply_rope(k), v, scale=scale))
  assert_close(out, expected, 1e-6)


def test_pure_function_composes_with_jit_vmap_grad():
  x = _inputs(8, (3, 2, 5, EMBED))  # an extra leading axis to vmap over
  layer = aj.MultiHeadAttention(num_heads=HEADS, qkv_features=D_MODEL)
  params = layer.init(jax.random.key(0), x[0])["params"]
  fn = jax.jit(jax.vmap(lambda xi: aj.multi_head_attention(params, xi, is_causal=True)))
  assert_close(fn(x), aj.multi_head_attention(params, x, is_causal=True), 1e-6)
  grads = jax.grad(lambda p: jnp.sum(aj.multi_head_attention(p, x[0]) ** 2))(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("head_variant", [None, "gated"])
def test_maps_are_sown_beside_the_row_maxima_the_call_returns(head_variant):
  """Sowing the maps and returning each row's largest logit together: the maps are the call's,
  and the maxima are the maps' own row maxima (a variant that forms its maps refuses them)."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 16))
  mask = jnp.arange(6)[None, None, None, :] < jnp.array([6, 4])[:, None, None, None]
  layer = aj.MultiHeadAttention(num_heads=4, head_variant=head_variant)
  params = layer.init(jax.random.key(1), x)["params"]
  (y, largest), state = layer.apply({"params": params}, x, mask=mask, sow_weights=True,
                                    return_max_scores=True, mutable="intermediates")
  assert_close(y, layer.apply({"params": params}, x, mask=mask), rtol=1e-6)
  logits, weights = aj.attention_maps(params, x, mask=mask, return_max_scores=True,
                                      head_variant=layer.head_variant)
  assert_close(state["intermediates"]["attention_weights"][0], weights, rtol=1e-6)
  row_max = jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1)  # [B, N, T]
  assert_close(largest, jnp.swapaxes(row_max, -1, -2), rtol=1e-5)
