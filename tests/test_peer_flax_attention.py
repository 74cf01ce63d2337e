"""flax's own attention tests, re-run against attention_jax's modules beside flax's.

Adapted from flax 0.12.8's tests/linen/linen_attention_test.py and tests/nnx/nn/attention_test.py
(Apache-2.0; flax commit 3a491108), written again in our words. Each case that makes sense for our
modules runs on ``attention_jax.MultiHeadAttention`` (Linen) or ``attention_jax.nnx.
MultiHeadAttention`` (NNX) and, with the SAME weights, on flax's ``MultiHeadDotProductAttention``
or ``nnx.MultiHeadAttention``: where upstream checks a shape, a dtype or a sown value, we check it
and that it equals flax's. Our parameter tree is flax's (query/key/value {kernel [D_in, N, H],
bias [N, H]}, out {kernel [N, H, D_out], bias [D_out]}); our ``d_model`` is flax's
``qkv_features``. Outputs are compared deterministic (flax drops whole rows by default,
broadcast_dropout=True; we drop single weights). The function-level cases of the NNX file
(grouped-query shapes and parity, the causal-mask equivalence) run on every CPU implementation.

Where our meaning differs, on purpose:
- ``sow_weights=None`` (our default) sows whenever "intermediates" is mutable (Linen) or inside
  ``nnx.capture`` (NNX); flax's default is False. The sow cases pass ``sow_weights=False`` to the
  layer that upstream leaves quiet by default.
- the softmax is always float32 (our contract): flax's force_fp32_for_softmax=True case is ported,
  its bfloat16-softmax case is not.
- complex inputs (flax's test_dtype_infer) are refused with a ValueError naming the dtype; the
  dtype inference itself is checked on real dtypes, against flax's.
- masks are boolean (True = attend): the receptive-field case builds flax's causal mask with
  dtype=bool (flax's make_causal_mask defaults to float32, which we refuse in one line).

Where a case is changed to make the comparison with flax meaningful: inputs are random rather
than all ones, parameters are moved off their initial values, and the sow cases use the default
initializers instead of all-ones kernels (whose near one-hot weights turn rounding differences in
the first layers into different ties in the last).

Not ported, as they test flax's own API rather than attention: the inputs_k/inputs_v/inputs_kv
deprecation paths of test_multihead_kv_args (its cross-attention on unbatched inputs is ported),
test_multihead_mask_warning (a call-signature migration), the MultiHeadAttention alias tests,
test_dot_product_attention_precision_and_einsum_override and
test_dot_product_attention_specify_einsums_together (flax's einsum-injection arguments),
test_keep_rngs (flax's keep_rngs) and TestKVFeatures (flax's in_kv_features: our NNX module takes
one input width).
"""

import functools

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import nnx as ajnnx
from conftest import assert_close
from peer_helpers import IMPLEMENTATION_IDS
from peer_helpers import IMPLEMENTATIONS
from peer_helpers import normal

over_implementations = pytest.mark.parametrize("implementation", IMPLEMENTATIONS,
                                               ids=IMPLEMENTATION_IDS)
ones, zeros = nn.initializers.ones, nn.initializers.zeros
# Relative to the largest value, per computation dtype.
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.float64): 1e-5,
             jnp.dtype(jnp.float16): 1e-2, jnp.dtype(jnp.bfloat16): 2e-2}


def _key(seed):
  """An rbg key: jax.random's default threefry sampler compiles slowly on CPU, once per shape,
  and every parameter shape here is drawn once or twice."""
  return jax.random.key(seed, impl="rbg")


def _perturbed(variables, scale=0.1):
  """The parameters moved off their initial values (zero biases, unit scales), so that a misplaced
  one cannot hide; other collections unchanged."""
  leaves, tree = jax.tree.flatten(variables["params"])
  moved = [p + scale * normal((9, i), p.shape, p.dtype) for i, p in enumerate(leaves)]
  return {**variables, "params": jax.tree.unflatten(tree, moved)}


def _linen_pair(num_heads, d_model=None, **options):
  """Ours and flax's Linen attention with the same configuration."""
  ours = aj.MultiHeadAttention(num_heads=num_heads, qkv_features=d_model, **options)
  options.pop("implementation", None)
  theirs = nn.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=d_model, **options)
  return ours, theirs


def _flax_nnx_params(module):
  """flax.nnx.MultiHeadAttention's parameters as a Linen-style dict (the layout ours loads)."""
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


# linen_attention_test.py

@over_implementations
def test_multihead_self_attention(implementation):
  x = normal(0, (4, 6, 5))
  ours, theirs = _linen_pair(8, 16, kernel_init=ones, bias_init=zeros,
                             implementation=implementation)
  y, variables = ours.init_with_output(_key(0), x)
  assert y.shape == x.shape and y.dtype == jnp.float32
  assert jax.tree.structure(variables) == jax.tree.structure(theirs.init(_key(0), x))
  variables = _perturbed(variables)
  assert_close(ours.apply(variables, x), theirs.apply(variables, x), 1e-5)


@pytest.mark.parametrize("x_dtype, param_dtype, dtype", [
    (jnp.float32, jnp.float32, None), (jnp.bfloat16, jnp.float32, None),
    (jnp.bfloat16, jnp.bfloat16, None), (jnp.float16, jnp.float16, None),
    (jnp.float32, jnp.float32, jnp.bfloat16)])
def test_dtype_infer(x_dtype, param_dtype, dtype):
  """The computation dtype as flax infers it: ``dtype``, else the inputs and parameters promoted;
  the output in that dtype and equal to flax's."""
  x = normal(1, (4, 6, 5), x_dtype)
  ours, theirs = _linen_pair(8, 16, dtype=dtype, param_dtype=param_dtype)
  # Under jit: each dtype is new to every operation, and one program compiles faster than each.
  variables = _perturbed(jax.jit(ours.init)(_key(0), x))
  expected = jax.jit(theirs.apply)(variables, x)
  actual = jax.jit(ours.apply)(variables, x)
  assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
  assert_close(actual, expected, TOLERANCE[expected.dtype])


def test_dtype_infer_refuses_complex_inputs():
  """flax computes attention over complex64 inputs; our contract is a real floating dtype."""
  x = jnp.ones((4, 6, 5), jnp.complex64)
  with pytest.raises(ValueError, match="complex64"):
    aj.MultiHeadAttention(num_heads=8, qkv_features=16).init(_key(0), x)


@over_implementations
def test_multihead_encoder_decoder_attention(implementation):
  """Two batch dims, [4, 2, 3, 5]."""
  q = normal(2, (4, 2, 3, 5))
  ours, theirs = _linen_pair(8, 16, implementation=implementation)
  y, variables = ours.init_with_output(_key(0), q)
  assert y.shape == q.shape
  variables = _perturbed(variables)
  assert_close(ours.apply(variables, q), theirs.apply(variables, q), 1e-5)


def test_mha_out_initializers():
  q = jnp.ones((4, 2, 3, 5))
  layer = aj.MultiHeadAttention(num_heads=8, qkv_features=16, kernel_init=ones, bias_init=zeros,
                                out_kernel_init=zeros, out_bias_init=ones)
  params = layer.init(_key(0), q)["params"]
  for name in ("query", "key", "value"):
    np.testing.assert_array_equal(params[name]["kernel"], 1.0)
    np.testing.assert_array_equal(params[name]["bias"], 0.0)
  np.testing.assert_array_equal(params["out"]["kernel"], 0.0)
  np.testing.assert_array_equal(params["out"]["bias"], 1.0)


def test_multihead_self_attention_w_dropout():
  x = jnp.ones((4, 2, 3, 5))
  layer = aj.MultiHeadAttention(num_heads=8, qkv_features=16, kernel_init=ones, bias_init=zeros,
                                dropout_rate=0.1)
  params_key, dropout_key = jax.random.split(_key(0))
  rngs = {"params": params_key, "dropout": dropout_key}
  y, variables = layer.init_with_output(rngs, x, deterministic=False)
  assert y.shape == x.shape
  # Beyond upstream: the dropout acted (x is constant, so the weights are uniform before it).
  assert not np.array_equal(y, layer.apply(variables, x, deterministic=True))


class _TwoLayers(nn.Module):
  """Two attention layers on the same input, each given the dropout key (cloned for the second),
  as upstream's Foo."""
  options: dict

  @nn.compact
  def __call__(self, x, dropout_rng=None):
    a = aj.MultiHeadAttention(**self.options)(x, x, dropout_rng=dropout_rng, deterministic=False)
    if dropout_rng is not None:
      dropout_rng = jax.random.clone(dropout_rng)
    b = aj.MultiHeadAttention(**self.options)(x, x, dropout_rng=dropout_rng, deterministic=False)
    return a, b


def test_multihead_self_attention_explicit_dropout():
  """A ``dropout_rng`` given at the call decides the dropout; without it, each layer draws its own
  key from the "dropout" stream."""
  clone = lambda keys: jax.tree.map(jax.random.clone, keys)
  module = _TwoLayers(dict(num_heads=8, qkv_features=16, kernel_init=ones, bias_init=zeros,
                           dropout_rate=0.5))
  k1, k2, k3, k4 = jax.random.split(_key(0), 4)
  x = jnp.ones((4, 2, 3, 5))
  rngs = {"params": k1, "dropout": k2}
  variables = module.init(rngs, x)
  a, b = module.apply(variables, x, rngs=clone(rngs))
  c, d = module.apply(variables, x, rngs={"dropout": clone(k2)})
  e, f = module.apply(variables, x, rngs={"dropout": k3})
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, c)
  np.testing.assert_array_equal(b, d)
  assert not np.array_equal(a, e) and not np.array_equal(b, f)
  a, b = module.apply(variables, x, rngs=clone(rngs), dropout_rng=k4)
  np.testing.assert_array_equal(a, b)
  a, b = module.apply(variables, x, dropout_rng=clone(k4))
  np.testing.assert_array_equal(a, b)
  assert a.shape == b.shape == x.shape


def test_multihead_self_attention_w_dropout_disabled():
  """A rate of 0, or a deterministic call, leaves the output independent of the rngs."""
  x = normal(3, (4, 2, 3, 5))
  keys = jax.random.split(_key(0), 4)
  rngs1, rngs2 = {"params": keys[0], "dropout": keys[1]}, {"params": keys[2], "dropout": keys[3]}
  options = dict(num_heads=8, qkv_features=16, kernel_init=ones, bias_init=zeros)
  no_rate = aj.MultiHeadAttention(dropout_rate=0.0, **options)
  y1, variables = no_rate.init_with_output(rngs1, x, deterministic=False)
  y2, _ = no_rate.init_with_output(rngs2, x, deterministic=False)
  np.testing.assert_array_equal(y1, y2)
  np.testing.assert_array_equal(no_rate.apply(variables, x, deterministic=False, rngs=rngs1),
                                no_rate.apply(variables, x, deterministic=False, rngs=rngs2))
  with_rate = aj.MultiHeadAttention(dropout_rate=0.5, **options)
  np.testing.assert_array_equal(with_rate.apply(variables, x, deterministic=True, rngs=rngs1),
                                with_rate.apply(variables, x, deterministic=True, rngs=rngs2))


def test_causal_mask_1d():
  """Our causal mask, broadcast as flax's make_causal_mask is."""
  theirs = nn.make_causal_mask(jnp.ones((3, 16)))  # [3, 1, 16, 16]
  np.testing.assert_array_equal(np.broadcast_to(aj.causal_mask(16), theirs.shape), theirs)


def _decode_token_by_token(layer, params, cache, inputs):
  """Feeds inputs [..., L, D] one position at a time (axis -2) through ``layer`` with decode;
  returns the outputs [..., L, D_out]."""
  step = jax.jit(lambda cache, x: layer.apply({"params": params, "cache": cache}, x,
                                              mutable=["cache"]))
  outputs = []
  for t in range(inputs.shape[-2]):
    y, state = step(cache, inputs[..., t:t + 1, :])
    cache = state["cache"]
    outputs.append(y)
  return jnp.concatenate(outputs, axis=-2)


def _decoding_pair(implementation=None):
  return _linen_pair(3, 12, precision=jax.lax.Precision.HIGHEST, decode=True,
                     implementation=implementation)


@functools.lru_cache(maxsize=None)
def _flax_decoding(spatial_shape):
  """Inputs [2, *spatial, 12], our decoding variables (parameters perturbed) and flax's decoding
  of the inputs with those parameters (the same for every implementation of ours)."""
  inputs = normal(4, (2,) + spatial_shape + (12,))
  ours, theirs = _decoding_pair()
  variables = ours.init(_key(1), inputs)
  variables = {"params": _perturbed(variables)["params"], "cache": variables["cache"]}
  their_cache = theirs.init(_key(1), inputs)["cache"]
  return inputs, variables, _decode_token_by_token(theirs, variables["params"], their_cache,
                                                   inputs)


@over_implementations
@pytest.mark.parametrize("spatial_shape", [(5,), (6, 5)], ids=["1d", "2d"])
def test_decoding(spatial_shape, implementation):
  """Decoding one position at a time equals the causal pass over the whole input, and flax's
  decoding with the same weights (inputs [2, *spatial, 12], attention over the last spatial axis,
  the others batch)."""
  inputs, variables, their_decoded = _flax_decoding(spatial_shape)
  ours, _ = _decoding_pair(implementation)
  assert variables["cache"]["cached_key"].shape == inputs.shape[:-1] + (3, 4)  # [..., L, K, H]
  decoded = _decode_token_by_token(ours, variables["params"], variables["cache"], inputs)
  full = ours.clone(decode=False).apply({"params": variables["params"]}, inputs, is_causal=True)
  np.testing.assert_allclose(decoded, full, atol=1e-5)  # upstream's tolerance
  np.testing.assert_allclose(decoded, their_decoded, atol=1e-5)


@over_implementations
def test_autoregressive_receptive_field_1d(implementation):
  """Under flax's causal mask, output t depends on inputs 0..t and on no later one."""
  length = 10
  inputs = normal(5, (1, length, 1))
  layer = aj.MultiHeadAttention(num_heads=1, kernel_init=ones, implementation=implementation)
  variables = layer.init(_key(1), inputs)
  mask = nn.make_causal_mask(jnp.ones((1, length)), dtype=jnp.bool_)  # ours takes bool masks

  @jax.jit
  def receptive_field(pos):
    grad = jax.grad(lambda x: layer.apply(variables, x, mask=mask)[0, pos].sum())(inputs)
    return jnp.any(jnp.abs(grad[0]) > 1e-5, axis=-1)  # [length]

  for pos in range(length):
    reached = np.asarray(receptive_field(pos))
    assert reached[:pos + 1].all(), f"position {pos} does not see all earlier positions"
    assert not reached[pos + 1:].any(), f"position {pos} sees a later position"


@over_implementations
def test_multihead_kv_args(implementation):
  """Cross-attention on unbatched inputs: query [3, 5], keys and values [9, 5]."""
  query, key_value = normal(6, (3, 5)), normal(7, (9, 5))
  ours, theirs = _linen_pair(8, 16, kernel_init=ones, bias_init=zeros,
                             implementation=implementation)
  variables = _perturbed(ours.init(_key(43279), query, key_value))
  expected = theirs.apply(variables, query, key_value)  # flax's inputs_v defaults to inputs_k
  assert_close(ours.apply(variables, query, key_value), expected, 1e-5)


class _ThreeLayers(nn.Module):
  """Three attention layers in a row; the middle one does not sow (flax's default; ours is told).
  Upstream's all-ones kernels are left out: their near one-hot weights turn rounding differences
  in the first layers into different ties in the last."""
  ours: bool

  @nn.compact
  def __call__(self, x, sow_weights=False):
    options = dict(num_heads=8)
    make = ((lambda name: aj.MultiHeadAttention(qkv_features=16, name=name, **options)) if self.ours
            else (lambda name: nn.MultiHeadDotProductAttention(qkv_features=16, name=name,
                                                              **options)))
    quiet = {"sow_weights": False} if self.ours else {}
    x = make("attention_0")(x, sow_weights=sow_weights)
    x = make("attention_1")(x, **quiet)
    return make("attention_2")(x, sow_weights=sow_weights)


def test_multihead_sow_attention_weights():
  x = normal(8, (4, 6, 5))
  ours, theirs = _ThreeLayers(ours=True), _ThreeLayers(ours=False)
  variables = _perturbed(ours.init(_key(0), x))
  _, state = ours.apply(variables, x, mutable=["intermediates"], sow_weights=True)
  _, their_state = theirs.apply(variables, x, mutable=["intermediates"], sow_weights=True)
  sown = state["intermediates"]
  assert set(sown) == {"attention_0", "attention_2"}
  for name in sown:
    weights = sown[name]["attention_weights"][0]
    assert weights.shape == (4, 8, 6, 6)
    assert_close(weights, their_state["intermediates"][name]["attention_weights"][0], 1e-5)
  _, state = ours.apply(variables, x, mutable=["intermediates"], sow_weights=False)
  assert "intermediates" not in state


def test_autoregressive_decode_with_x64():
  """Decoding float64 inputs over float32 parameters, two steps, as flax: same shapes, dtypes and
  values."""
  with jax.enable_x64():
    x = normal(9, (1, 4, 4), jnp.float64)
    ours, theirs = _linen_pair(2, 4, decode=True)
    variables = ours.init(_key(0), x)
    params = _perturbed(variables)["params"]
    their_cache = theirs.init(_key(0), x)["cache"]

    def two_steps(layer, cache):
      outputs = []
      for t in range(2):
        y, state = layer.apply({"params": params, "cache": cache}, x[:, t:t + 1],
                               mutable=["cache"])
        cache = state["cache"]
        outputs.append(y)
      return outputs

    for mine, their in zip(two_steps(ours, variables["cache"]), two_steps(theirs, their_cache)):
      assert mine.shape == their.shape == (1, 1, 4)
      assert mine.dtype == their.dtype, (mine.dtype, their.dtype)
      assert_close(mine, their, 1e-5)


def test_mixed_precision_multihead_attention():
  """bfloat16 computation over float32 parameters: the sown weights are float32 (flax's
  force_fp32_for_softmax=True case; ours always is), the output equals flax's."""
  x = normal(10, (2, 4))
  ours, theirs = _linen_pair(2, 4, dtype=jnp.bfloat16, bias_init=nn.initializers.uniform())
  theirs = theirs.clone(force_fp32_for_softmax=True)
  variables = ours.init(_key(1), x)
  y, state = ours.apply(variables, x, mutable=["intermediates"], sow_weights=True)
  their_y, their_state = theirs.apply(variables, x, mutable=["intermediates"], sow_weights=True)
  weights = state["intermediates"]["attention_weights"][0]
  assert weights.dtype == jnp.float32
  assert y.dtype == their_y.dtype == jnp.bfloat16
  assert_close(y, their_y, TOLERANCE[jnp.dtype(jnp.bfloat16)])
  assert_close(weights, their_state["intermediates"]["attention_weights"][0], 1e-2)


# nnx/nn/attention_test.py

def _set_params(module, params):
  """Sets an NNX module's parameters from a Linen-style dict; returns the module."""
  state = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(module, state)
  return module


def _nnx_pair(num_heads, in_features, d_model=None, **options):
  """Ours and flax's NNX attention, both holding flax's initial weights, perturbed."""
  theirs = nnx.MultiHeadAttention(num_heads, in_features, d_model, rngs=nnx.Rngs(_key(0)),
                                  **options)
  params = _perturbed({"params": _flax_nnx_params(theirs)})["params"]
  ours = ajnnx.MultiHeadAttention(num_heads, in_features, qkv_features=d_model,
                                  rngs=nnx.Rngs(_key(0)), **options)
  return ajnnx.load_linen_params(ours, params), _set_params(theirs, params)


def test_nnx_basic():
  ours, theirs = _nnx_pair(2, 3, 6, out_features=6)
  x = normal(11, (1, 7, 3))
  y = ours(x, decode=False)
  assert y.shape == (1, 7, 6)
  assert_close(y, theirs(x, decode=False), 1e-5)


class _NNXThreeLayers(nnx.Module):
  """Three attention layers in a row; the middle one never sows."""

  def __init__(self, make, *, quiet_middle):
    self.attention_layers = nnx.data([make() for _ in range(3)])
    self.quiet_middle = quiet_middle

  def __call__(self, x, sow_weights=False):
    x = self.attention_layers[0](x, sow_weights=sow_weights)
    x = self.attention_layers[1](x, **({"sow_weights": False} if self.quiet_middle else {}))
    return self.attention_layers[2](x, sow_weights=sow_weights)


def test_nnx_multihead_sow_attention_weights():
  rngs = nnx.Rngs(_key(0))  # default initializers, as in the Linen case
  theirs = _NNXThreeLayers(lambda: nnx.MultiHeadAttention(8, 8, rngs=rngs, deterministic=False),
                           quiet_middle=False)
  theirs.set_attributes(decode=False)
  ours = _NNXThreeLayers(lambda: ajnnx.MultiHeadAttention(8, 8, rngs=rngs, deterministic=False),
                         quiet_middle=True)
  for mine, their in zip(ours.attention_layers, theirs.attention_layers):
    params = _perturbed({"params": _flax_nnx_params(their)})["params"]
    ajnnx.load_linen_params(mine, params)
    _set_params(their, params)
  x = normal(12, (4, 6, 8))
  _, captured = nnx.capture(ours, nnx.Intermediate)(x, True)
  _, their_captured = nnx.capture(theirs, nnx.Intermediate)(x, True)
  layers = captured["attention_layers"]
  assert 1 not in layers and set(layers) == {0, 2}
  for i in (0, 2):
    weights = layers[i]["attention_weights"][0]
    assert weights.shape == (4, 8, 6, 6)
    assert_close(weights, their_captured["attention_layers"][i]["attention_weights"][0], 1e-5)
  _, captured = nnx.capture(ours, nnx.Intermediate)(x)
  assert not captured


def test_nnx_autoregressive_decode_with_x64():
  with jax.enable_x64():
    x = normal(13, (1, 4, 4), jnp.float64)
    ours, theirs = _nnx_pair(2, 4, 4, decode=True)
    for layer in (ours, theirs):
      layer.init_cache(x.shape, dtype=x.dtype)
      assert layer.cached_key.shape == layer.cached_value.shape == (1, 4, 2, 2)
    for t in range(2):
      y, their_y = ours(x[:, t:t + 1]), theirs(x[:, t:t + 1])
      assert y.shape == (1, 1, 4) and y.dtype == their_y.dtype
      assert_close(y, their_y, 1e-5)


@over_implementations
@pytest.mark.parametrize("use_padding", [True, False], ids=["padding", "no_padding"])
@pytest.mark.parametrize("cross", [True, False], ids=["cross", "self"])
def test_causal_mask_equivalence(cross, use_padding, implementation):
  """A precombined causal (and padding) mask equals is_causal=True with the padding mask alone;
  two batch dims [1, 1, ...]. Rows with no key average the values, as flax's (the default
  empty_rows="mean"), so flax's output is compared everywhere."""
  q_len, heads = 2, 2
  kv_len = 4 if cross else q_len
  q = normal(14, (1, 1, q_len, heads, 4))
  k, v = (normal(i, (1, 1, kv_len, heads, 4)) for i in (15, 16))
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((q_len, kv_len), bool)), (1, 1, heads, q_len,
                                                                         kv_len))
  padding = None
  if use_padding:
    padding = jnp.ones((1, 1, 1, q_len, kv_len), bool).at[..., -2:].set(False)
  combined = causal if padding is None else causal & padding
  attention = functools.partial(aj.dot_product_attention, implementation=implementation)
  precombined = attention(q, k, v, mask=combined)
  with_flag = attention(q, k, v, mask=padding, is_causal=True)
  np.testing.assert_allclose(precombined, with_flag, atol=1e-6)  # upstream's tolerance
  theirs = nnx.dot_product_attention(q, k, v, mask=combined)
  np.testing.assert_allclose(precombined, theirs, atol=1e-6)


PRECISIONS = (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH, jax.lax.Precision.HIGHEST)
EQUIVALENCE_GRID = [  # upstream's grid, each point with one of the three precisions in turn
    dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, decode=decode,
         normalize_qk=normalize_qk)
    for use_bias in (True, False) for dtype in (jnp.float32, jnp.float16)
    for param_dtype in (jnp.float32, jnp.float16) for decode in (True, False)
    for normalize_qk in (True, False)]
EQUIVALENCE_GRID = [dict(point, precision=PRECISIONS[i % 3])
                    for i, point in enumerate(EQUIVALENCE_GRID)]


@pytest.mark.parametrize("options", EQUIVALENCE_GRID, ids=lambda o: "-".join(
    f"{k}={getattr(v, '__name__', v)}" for k, v in o.items()))
def test_nnx_attention_equivalence(options):
  """flax's TestLinenConsistency, for ours: our NNX module equals our Linen module exactly, given
  flax Linen's weights, and both equal flax's Linen module (one token of width 3, as upstream).
  Upstream crosses its 32 points with three precisions (96 runs; on CPU they compute alike);
  here each point takes one precision in turn (32 runs, each precision on 10 or 11)."""
  x = jnp.ones((1, 3))
  decode = options["decode"]
  theirs = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=6, out_features=6,
                                           **options)
  variables = theirs.init(_key(42), x)
  ours_linen = aj.MultiHeadAttention(num_heads=2, qkv_features=6, out_features=6, **options)
  ours_nnx = ajnnx.MultiHeadAttention(2, 3, qkv_features=6, out_features=6,
                                      rngs=nnx.Rngs(_key(42)), **options)
  ajnnx.load_linen_params(ours_nnx, variables["params"])
  if decode:
    ours_nnx.init_cache(x.shape, dtype=options["dtype"])
    cache = ours_linen.init(_key(42), x)["cache"]
    linen_out, _ = ours_linen.apply({"params": variables["params"], "cache": cache}, x,
                                    mutable=["cache"])
  else:
    linen_out = ours_linen.apply({"params": variables["params"]}, x)
  nnx_out = ours_nnx(x)
  their_out, _ = theirs.apply(variables, x, mutable=["cache"])
  np.testing.assert_array_equal(nnx_out, linen_out)
  assert nnx_out.dtype == their_out.dtype, (nnx_out.dtype, their_out.dtype)
  assert_close(nnx_out, their_out, TOLERANCE[jnp.dtype(their_out.dtype)])


@over_implementations
def test_gqa_shapes(implementation):
  """Six query heads on three key/value heads, against flax's dot_product_attention."""
  query = normal(17, (2, 4, 6, 8))
  key, value = normal(18, (2, 5, 3, 8)), normal(19, (2, 5, 3, 8))
  output = aj.dot_product_attention(query, key, value, implementation=implementation)
  assert output.shape == (2, 4, 6, 8)
  assert_close(output, nnx.dot_product_attention(query, key, value), 1e-5)


@over_implementations
def test_gqa_invalid_heads(implementation):
  query, key = jnp.ones((1, 4, 5, 8)), jnp.ones((1, 4, 2, 8))
  with pytest.raises(ValueError, match="must be a multiple"):
    aj.dot_product_attention(query, key, key, implementation=implementation)


def test_gqa_multihead_attention():
  """32 query heads on 8 key/value heads: kernel shapes, the cache, one decoding step; our NNX and
  Linen modules equal flax's NNX module with the same weights."""
  in_features, heads, kv_heads, d_model = 128, 32, 8, 2048
  head_dim = d_model // heads
  ours, theirs = _nnx_pair(heads, in_features, d_model, num_kv_heads=kv_heads)
  assert ours.query.kernel.shape == (in_features, heads, head_dim)
  assert ours.key.kernel.shape == ours.value.kernel.shape == (in_features, kv_heads, head_dim)
  x = normal(20, (1, 10, in_features))
  y = ours(x, decode=False)
  assert y.shape == (1, 10, in_features)
  assert_close(y, theirs(x, decode=False), 1e-5)
  linen = aj.MultiHeadAttention(num_heads=heads, qkv_features=d_model, num_kv_heads=kv_heads)
  assert_close(linen.apply({"params": ajnnx.linen_params(ours)}, x), y, 1e-5)
  for layer in (ours, theirs):
    layer.init_cache((1, 10, in_features))
  assert ours.cached_key.shape == (1, 10, kv_heads, head_dim)
  token = normal(21, (1, 1, in_features))
  y_token = ours(token, decode=True)
  assert y_token.shape == (1, 1, in_features)
  assert int(ours.cache_index[...]) == 1
  assert_close(y_token, theirs(token, decode=True), 1e-5)


@over_implementations
def test_gqa_parity_with_jax(implementation):
  query = normal(22, (2, 8, 4, 16))
  key, value = normal(23, (2, 8, 2, 16)), normal(24, (2, 8, 2, 16))
  ours = aj.dot_product_attention(query, key, value, implementation=implementation)
  np.testing.assert_allclose(ours, jax.nn.dot_product_attention(query, key, value), atol=1e-3,
                             rtol=1e-3)  # upstream's tolerance
