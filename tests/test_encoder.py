"""The encoder and classifier: permutation equivariance, padding, pooling, composition."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import attention_jax as aj

LENGTH = 8
TOKENS = jnp.array([[3, 9, 4, 7, 1, 12, 5, 8], [2, 6, 11, 10, 13, 14, 15, 9]])  # distinct, no pad


def _encoder(positional_encoding, pre_layer_norm=False, **kwargs):
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=2, mlp_dim=64,
                            max_length=LENGTH, positional_encoding=positional_encoding,
                            pre_layer_norm=pre_layer_norm, **kwargs)
  model = aj.TransformerEncoder(config)
  variables = model.init(jax.random.key(0), TOKENS)
  return jax.jit(lambda tokens: model.apply(variables, tokens))


ENCODERS = {(name, pre_ln): _encoder(name, pre_ln) for name in aj.POSITIONAL_ENCODINGS
            for pre_ln in (False, True)}


def _equivariance_error(encode, permutation):
  permutation = np.asarray(permutation)
  return float(jnp.max(jnp.abs(encode(TOKENS[:, permutation]) - encode(TOKENS)[:, permutation])))


@settings(max_examples=20, deadline=None)
@given(permutation=st.permutations(range(LENGTH)), pre_ln=st.booleans())
def test_without_positional_encoding_the_encoder_is_permutation_equivariant(permutation, pre_ln):
  assert _equivariance_error(ENCODERS["none", pre_ln], permutation) < 1e-5


@settings(max_examples=20, deadline=None)
@given(permutation=st.permutations(range(LENGTH)), pre_ln=st.booleans(),
       name=st.sampled_from(["sinusoidal", "learned", "rope", "alibi"]))
def test_with_any_positional_encoding_it_is_not(permutation, pre_ln, name):
  assume(list(permutation) != list(range(LENGTH)))
  if name == "alibi":  # symmetric ALiBi sees only |t - s|, which a reversal preserves
    assume(list(permutation) != list(range(LENGTH))[::-1])
  assert _equivariance_error(ENCODERS[name, pre_ln], permutation) > 1e-2


def test_symmetric_alibi_is_equivariant_to_reversal_only():
  reverse = list(range(LENGTH))[::-1]
  assert _equivariance_error(ENCODERS["alibi", False], reverse) < 1e-5
  assert _equivariance_error(ENCODERS["rope", False], reverse) > 1e-2


def test_padding_tokens_do_not_change_real_token_outputs():
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=2,
                            positional_encoding="sinusoidal")
  model = aj.TransformerEncoder(config)
  valid = jnp.arange(LENGTH) < jnp.array([[5], [8]])
  variables = model.init(jax.random.key(0), TOKENS, valid)
  changed = TOKENS.at[0, 5:].set(jnp.array([1, 2, 3]))  # different ids at padded positions
  out, out_changed = model.apply(variables, TOKENS, valid), model.apply(variables, changed, valid)
  np.testing.assert_allclose(out[0, :5], out_changed[0, :5], atol=1e-6)
  np.testing.assert_array_equal(out[1], out_changed[1])


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_pools_only_real_tokens_and_trains(pooling):
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=1,
                            num_classes=3, pooling=pooling, dropout_rate=0.1)
  model = aj.SequenceClassifier(config)
  padded = jnp.array([[3, 9, 4, 0, 0, 0], [0, 0, 0, 0, 0, 0]])  # second: all padding
  variables = model.init(jax.random.key(0), padded)
  logits = model.apply(variables, padded)
  assert logits.shape == (2, 3) and np.all(np.isfinite(logits))
  longer = jnp.pad(padded, ((0, 0), (0, 4)))  # more padding changes nothing
  if pooling == "mean":  # the CLS row attends to the same keys; mean divides by real tokens
    np.testing.assert_allclose(model.apply(variables, longer), logits, atol=1e-5)
  else:
    np.testing.assert_allclose(model.apply(variables, longer)[0], logits[0], atol=1e-5)

  chex.clear_trace_counter()

  @chex.assert_max_traces(n=1)
  def loss(params, tokens, labels, rng):
    logits = model.apply({"params": params}, tokens, deterministic=False,
                         rngs={"dropout": rng})
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

  train_step = jax.jit(jax.value_and_grad(loss))  # traced once, run three times
  labels = jnp.array([1, 2])
  for step in range(3):
    value, grads = train_step(variables["params"], padded, labels, jax.random.key(step))
    assert np.isfinite(value)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_post_layer_norm_outputs_are_normalised_and_pre_layer_norm_has_a_final_norm():
  out = ENCODERS["sinusoidal", False](TOKENS)  # post-LN: the last op is LayerNorm (scale 1)
  np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(out.var(-1), 1.0, rtol=1e-3)
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, pre_layer_norm=True)
  params = aj.TransformerEncoder(config).init(jax.random.key(0), TOKENS)["params"]
  assert "final_norm" in params


def test_the_attention_module_can_be_swapped():
  import flax.linen as nn

  class Silent(nn.Module):  # same constructor fields and call signature, attends to nothing
    num_heads: int
    scale: object = "inv_sqrt"
    dropout_rate: float = 0.0
    implementation: object = None
    qk_transform: object = None

    def __call__(self, x, *, mask=None, bias=None, deterministic=True):
      return jnp.zeros_like(x)

  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=1,
                            positional_encoding="none", attention_module=Silent)
  model = aj.TransformerEncoder(config)
  variables = model.init(jax.random.key(0), TOKENS)
  assert "attention" not in variables["params"]["block_0"]
  # Without attention (and position) every token is processed alone: equal tokens, equal rows.
  out = model.apply(variables, jnp.array([[3, 3, 5]]))
  np.testing.assert_allclose(out[0, 0], out[0, 1], atol=1e-6)


def test_every_block_hands_its_layer_the_variant_it_was_given():
  """Plain MHA included: the layer runs the config's variant, never a default it guesses."""
  import flax.linen as nn
  handed = []

  def record(call, args, kwargs, context):
    if isinstance(context.module, aj.MultiHeadAttention) and context.method_name == "__call__":
      handed.append(context.module.head_variant)
    return call(*args, **kwargs)

  for name in ("mha", "gated"):
    handed.clear()
    config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=2,
                              head_variant=name)
    with nn.intercept_methods(record):
      aj.TransformerEncoder(config).init(jax.random.key(0), TOKENS)
    assert handed == [aj.variants.get(name)] * 2


def test_token_classifier_reads_every_position_through_one_dense_layer():
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, num_layers=2, mlp_dim=64,
                            max_length=LENGTH, num_classes=5)
  model = aj.TokenClassifier(config)
  tokens = TOKENS.at[1, 5:].set(0)  # the second row padded after 5 tokens
  variables = model.init(jax.random.key(0), tokens)
  logits = model.apply(variables, tokens)
  assert logits.shape == (2, LENGTH, 5)
  # Directly: the encoder's vectors (no CLS token) times the logits kernel, plus its bias.
  params = variables["params"]
  encoded = aj.TransformerEncoder(config).apply({"params": params["encoder"]}, tokens)
  expected = (np.asarray(encoded, np.float64) @ np.asarray(params["logits"]["kernel"], np.float64)
              + np.asarray(params["logits"]["bias"], np.float64))
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  # What stands at padded positions does not reach the real positions' logits.
  changed = model.apply(variables, TOKENS, tokens != 0)
  np.testing.assert_allclose(changed[1, :5], logits[1, :5], atol=1e-6)


def test_head_dim_sets_d_k_apart_from_d_model():
  config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=1, num_layers=1, mlp_dim=64,
                            head_dim=128, normalize_qk=True)
  params = aj.TransformerEncoder(config).init(jax.random.key(0), TOKENS)["params"]
  attention = params["block_0"]["attention"]
  assert attention["query"]["kernel"].shape == (32, 1, 128)  # [D, N, d_k]
  assert attention["out"]["kernel"].shape == (1, 128, 32)
  assert attention["key_ln"]["scale"].shape == (128,)
  assert config.head_dim == 128
  assert aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4).head_dim == 8  # d_model / h
  with pytest.raises(ValueError, match="num_heads=3 must divide d_model=32"):
    aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=3)
  aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=3, head_dim=16)  # fine: d_k is given
  # replace() derives a derived d_k again, and keeps a given one
  derived = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4)
  assert dataclasses.replace(derived, num_heads=8).head_dim == 4
  assert dataclasses.replace(derived, d_model=64).head_dim == 16
  given = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, head_dim=16)
  assert dataclasses.replace(given, num_heads=8).head_dim == 16
  assert derived == aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=4, head_dim=8)


def test_vector_inputs_are_embedded_by_one_linear_layer():
  config = aj.EncoderConfig(vocab_size=0, d_model=32, num_heads=4, num_layers=1, mlp_dim=64,
                            max_length=LENGTH, input_features=3, positional_encoding="none")
  vectors = jax.random.normal(jax.random.key(1), (2, LENGTH, 3))  # [B, T, F]
  model = aj.TransformerEncoder(config)
  params = model.init(jax.random.key(0), vectors)["params"]
  assert params["embed"]["kernel"].shape == (3, 32)  # [F, D]
  # The block sees inputs W_E + b_E: the same block on the embedded vectors gives the same output.
  embedded = vectors @ params["embed"]["kernel"] + params["embed"]["bias"]  # [B, T, D]
  block = aj.EncoderBlock(config, aj.positional_encoding("none", max_length=LENGTH, num_heads=4))
  mask = jnp.ones((2, 1, LENGTH, LENGTH), bool)
  expected = block.apply({"params": params["block_0"]}, embedded, mask, None, True)
  np.testing.assert_allclose(model.apply({"params": params}, vectors), expected, atol=1e-5)
  with pytest.raises(ValueError, match="input_features must be positive"):
    aj.EncoderConfig(vocab_size=0, input_features=0)
  with pytest.raises(ValueError, match="vocab_size must be positive"):
    aj.EncoderConfig(vocab_size=0)


@pytest.mark.parametrize("scale", [0.125, 2.0])
def test_query_init_scale_multiplies_w_q_at_initialisation_and_nothing_else(scale):
  """W_Q's draw is lecun normal's times the scale (the same key, the same standard draw); every
  other parameter is unchanged, so an unscaled model started at W_Q x d_k^-1/2 has the logits of
  the 1/sqrt(d_k) model at step 0."""
  def params(s):
    config = aj.EncoderConfig(vocab_size=16, d_model=32, num_heads=2, num_layers=2, mlp_dim=32,
                              head_dim=64, query_init_scale=s)
    return aj.SequenceClassifier(config).init(jax.random.key(0),
                                              jnp.ones((2, 8), jnp.int32))["params"]
  plain, scaled = params(1.0), params(scale)
  for path, leaf in jax.tree_util.tree_leaves_with_path(plain):
    other = scaled
    for entry in path:
      other = other[entry.key]
    factor = scale if "query" in jax.tree_util.keystr(path) and "kernel" in jax.tree_util.keystr(
        path) else 1.0
    np.testing.assert_allclose(other, factor * leaf, rtol=1e-6, atol=0)


def test_query_init_scale_is_refused_where_it_cannot_apply():
  with pytest.raises(ValueError, match="query_init_scale must be positive"):
    aj.EncoderConfig(vocab_size=16, query_init_scale=0.0)
  layer = aj.MultiHeadAttention(num_heads=2, fused_qkv=True,
                                query_kernel_init=jax.nn.initializers.zeros)
  with pytest.raises(ValueError, match="query_kernel_init needs separate projections"):
    layer.init(jax.random.key(0), jnp.ones((1, 4, 8)))
