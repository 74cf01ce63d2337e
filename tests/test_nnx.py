"""The NNX shells and the NNX encoder of examples/nnx_encoder.py against their Linen twins (same
parameter trees, same outputs given the same weights), flax.nnx.MultiHeadAttention, captured
attention maps, dropout and NNX transforms."""

import doctest
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention_jax as aj
from attention_jax import nnx as ajnnx
from examples import nnx_encoder  # the NNX encoder, an example on the library
from conftest import assert_close

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENS = jnp.array([[3, 9, 4, 7, 1, 12, 5, 0], [2, 6, 11, 0, 0, 0, 0, 0]])  # pad_id 0 pads
SMALL = dict(vocab_size=16, d_model=16, num_heads=2, num_layers=2, mlp_dim=32, max_length=8,
             num_classes=3)


def _key(seed):
  # rbg keys: jax.random's default threefry sampler compiles slowly on CPU, once per shape and
  # again under vmap, which would be most of this file's time.
  return jax.random.key(seed, impl="rbg")


def _rngs(seed):
  return nnx.Rngs(_key(seed))


def _normal(shape, seed, scale=1.0):
  # NumPy draws: no sampler to compile per shape.
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _perturbed(params, seed=2):
  """Non-zero biases and LayerNorm scales away from 1, so a misplaced one cannot hide."""
  leaves, tree = jax.tree.flatten(params)
  return jax.tree.unflatten(tree, [p + _normal(p.shape, (seed, i), 0.1)
                                   for i, p in enumerate(leaves)])


def _shapes(tree):
  return jax.tree.map(jnp.shape, tree)


# Every positional encoding, pre- and post-LN, both poolings and every scale option, QK-norm,
# head_dim set apart from d_model, and dropout rates that deterministic mode must ignore.
CONFIGS = [
    dict(positional_encoding="none", pooling="cls", dropout_rate=0.3, attention_dropout_rate=0.3),
    dict(positional_encoding="sinusoidal", pre_layer_norm=True, pooling="mean",
         attention_scale="none"),
    dict(positional_encoding="learned", attention_scale="inv", normalize_qk=True),
    dict(positional_encoding="randomized", pooling="cls"),
    dict(positional_encoding="rope", pre_layer_norm=True, pooling="cls", attention_scale="learned",
         normalize_qk=True),
    dict(positional_encoding="alibi", pre_layer_norm=True, pooling="mean", attention_scale=0.3,
         head_dim=4),
]
SEQUENCE = (aj.SequenceClassifier, nnx_encoder.SequenceClassifier)
TOKEN = (aj.TokenClassifier, nnx_encoder.TokenClassifier)
HEADS = [SEQUENCE, SEQUENCE, TOKEN, SEQUENCE, SEQUENCE, SEQUENCE]  # the (Linen, NNX) pair for each config


VECTORS = _normal((2, 8, 5), 7)  # [B, T, F] inputs of a config with input_features=5


@pytest.mark.parametrize("options, classes, inputs", [
    *((options, classes, TOKENS) for options, classes in zip(CONFIGS, HEADS)),
    (dict(positional_encoding="none", input_features=5), SEQUENCE, VECTORS),
    (dict(positional_encoding="sinusoidal", input_features=5), TOKEN, VECTORS),
], ids=[o["positional_encoding"] for o in CONFIGS] + ["vectors_sequence", "vectors_token"])
def test_classifiers_hold_the_linen_parameter_tree_and_compute_the_same_logits(options, classes,
                                                                               inputs):
  linen_class, nnx_class = classes
  config = aj.EncoderConfig(**SMALL, **options)
  linen, model = linen_class(config), nnx_class(config, rngs=_rngs(1))
  params = ajnnx.linen_params(model)
  linen_shapes = jax.eval_shape(linen.init, jax.random.key(0), inputs)["params"]
  assert _shapes(params) == _shapes(linen_shapes)
  params = _perturbed(params)
  ajnnx.load_linen_params(model, {"params": params})
  jax.tree.map(np.testing.assert_array_equal, ajnnx.linen_params(model), params)  # round trip
  assert_close(model(inputs), linen.apply({"params": params}, inputs), 1e-6)


def test_every_positional_encoding_has_an_nnx_twin_and_is_compared_above():
  assert ajnnx.POSITIONAL_ENCODINGS.keys() == aj.POSITIONAL_ENCODINGS.keys()
  assert {o["positional_encoding"] for o in CONFIGS} == set(aj.POSITIONAL_ENCODINGS)


def test_parameter_names_are_those_of_the_linen_modules():
  config = aj.EncoderConfig(**SMALL, positional_encoding="learned", pre_layer_norm=True,
                            normalize_qk=True, attention_scale="learned")
  params = ajnnx.linen_params(nnx_encoder.SequenceClassifier(config, rngs=_rngs(0)))
  assert set(params) == {"encoder", "logits"}
  assert set(params["encoder"]) == {"embed", "cls", "positional", "block_0", "block_1",
                                    "final_norm"}
  block = params["encoder"]["block_1"]
  assert set(block) == {"attention", "feed_forward", "norm_0", "norm_1"}
  assert set(block["feed_forward"]) == {"hidden", "output"}
  assert set(block["attention"]) == {"query", "key", "value", "out", "query_ln", "key_ln",
                                     "temperature"}
  assert params["encoder"]["positional"]["table"].shape == (SMALL["max_length"] + 1, 16)


def _attention_pair(**options):
  """A Linen MultiHeadAttention and its NNX twin with the same (perturbed) weights: 2 heads of
  d_k = 4 on inputs of width 16, output width 12."""
  linen = aj.MultiHeadAttention(num_heads=2, qkv_features=8, out_features=12, **options)
  model = ajnnx.MultiHeadAttention(2, 16, qkv_features=8, out_features=12, rngs=_rngs(0),
                                   **options)
  cross = not options.get("fused_qkv")
  x_q = _normal((2, 8, 16), 3)
  x_kv = _normal((2, 6, 16), 4) if cross else None
  linen_shapes = jax.eval_shape(linen.init, jax.random.key(0), x_q, x_kv)["params"]
  params = ajnnx.linen_params(model)
  assert _shapes(params) == _shapes(linen_shapes)
  variables = {"params": _perturbed(params)}
  return linen, variables, ajnnx.load_linen_params(model, variables), x_q, x_kv


@pytest.mark.parametrize("options", [
    dict(), dict(scale="none", normalize_qk=True), dict(scale="inv", fused_qkv=True),
    dict(scale="learned", use_bias=False), dict(scale=0.3, qk_transform=lambda q, k: (
        aj.apply_rope(q), aj.apply_rope(k)))], ids=["inv_sqrt", "none-qknorm", "inv-fused",
                                                    "learned-nobias", "float-rope"])
def test_multi_head_attention_equals_the_linen_module(options):
  linen, variables, model, x_q, x_kv = _attention_pair(**options)
  length = 8 if x_kv is None else 6
  mask = aj.padding_mask(jnp.arange(length) < jnp.array([[length], [3]]))  # [B, 1, 1, S]
  bias = _normal((2, 8, length), 5, 0.5)  # [N, T, S]
  for call in [dict(mask=mask, bias=bias), dict(is_causal=x_kv is None)]:
    assert_close(model(x_q, x_kv, **call), linen.apply(variables, x_q, x_kv, **call), 1e-6)


def test_captured_attention_maps_equal_linen_and_leave_the_output_unchanged():
  linen, variables, model, x_q, x_kv = _attention_pair(normalize_qk=True)
  mask = aj.padding_mask(jnp.arange(6) < jnp.array([[6], [3]]))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no sow outside nnx.capture (deprecated in flax 0.12)
    plain = model(x_q, x_kv, mask=mask)
  assert not any(isinstance(v, nnx.Intermediate) for v in vars(model).values())
  captured, maps = nnx.capture(model, nnx.Intermediate)(x_q, x_kv, mask=mask, sow_weights=True)
  np.testing.assert_array_equal(captured, plain)
  _, state = linen.apply(variables, x_q, x_kv, mask=mask, mutable="intermediates",
                         sow_weights=True)
  for name in ("attention_logits", "attention_weights"):
    (ours,), (theirs,) = maps[name], state["intermediates"][name]
    assert ours.shape == (2, 2, 8, 6)
    assert_close(ours, theirs, 1e-6, name)
  assert np.all(maps["attention_weights"][0][1, :, :, 3:] == 0.0)  # padded keys get nothing

  # Through a whole model, under nnx.jit: the maps sit where Linen sows them.
  config = aj.EncoderConfig(**SMALL, **CONFIGS[0])
  linen_model = aj.SequenceClassifier(config)
  nnx_model = nnx_encoder.SequenceClassifier(config, rngs=_rngs(0))
  variables = {"params": _perturbed(ajnnx.linen_params(nnx_model))}
  ajnnx.load_linen_params(nnx_model, variables)
  forward = nnx.jit(nnx.capture(lambda m, tokens: m(tokens), nnx.Intermediate))
  logits, maps = forward(nnx_model, TOKENS)
  expected, state = linen_model.apply(variables, TOKENS, mutable="intermediates")
  assert_close(logits, expected, 1e-6)
  for layer in ("block_0", "block_1"):
    (ours,) = maps["encoder"][layer]["attention"]["attention_weights"]
    (theirs,) = state["intermediates"]["encoder"][layer]["attention"]["attention_weights"]
    assert ours.shape == (2, 2, 9, 9)  # with the CLS token
    assert_close(ours, theirs, 1e-6, layer)


def test_further_attention_arguments_reach_the_attention_and_the_captured_maps():
  if not hasattr(aj.attention, "structure_mask"):
    pytest.skip("this multihead.multi_head_attention takes no further attention arguments")
  linen, variables, model, x_q, _ = _attention_pair(fused_qkv=True)
  extra = dict(logits_soft_cap=2.0, local_window_size=(2, 1),
               key_value_seq_lengths=jnp.array([8, 5]))
  output, maps = nnx.capture(model, nnx.Intermediate)(x_q, sow_weights=True, **extra)
  expected, state = linen.apply(variables, x_q, mutable="intermediates", sow_weights=True,
                                **extra)
  assert_close(output, expected, 1e-6)
  assert not np.allclose(output, model(x_q))
  for name in ("attention_logits", "attention_weights"):
    assert_close(maps[name][0], state["intermediates"][name][0], 1e-6, name)


def test_multi_head_attention_equals_flax_nnx_multi_head_attention():
  """flax.nnx.MultiHeadAttention lays its weights out as ours: query/key/value kernels
  [in_features, N, H] (H = qkv_features / N), out kernel [N, H, out_features], QK LayerNorm
  scales [H]; so the same tree loads into both."""
  ours = ajnnx.MultiHeadAttention(2, 16, qkv_features=8, out_features=12, normalize_qk=True,
                                  rngs=_rngs(0))
  theirs = nnx.MultiHeadAttention(num_heads=2, in_features=16, qkv_features=8, out_features=12,
                                  normalize_qk=True, decode=False, rngs=_rngs(1))
  params = _perturbed(ajnnx.linen_params(ours))
  ajnnx.load_linen_params(ours, params)
  ajnnx.load_linen_params(theirs, params)
  x_q, x_kv = _normal((2, 8, 16), 3), _normal((2, 6, 16), 4)
  mask = aj.padding_mask(jnp.arange(6) < jnp.array([[6], [3]]))
  assert_close(ours(x_q, x_kv, mask=mask), theirs(x_q, x_kv, mask=mask), 1e-5)
  assert_close(ours(x_q), theirs(x_q), 1e-5)


def test_dropout_draws_from_the_rngs_and_deterministic_mode_ignores_it():
  config = aj.EncoderConfig(**SMALL, **CONFIGS[0])  # dropout_rate and attention's 0.3
  build = lambda: nnx_encoder.SequenceClassifier(config, rngs=_rngs(0))
  model = build()
  quiet = model(TOKENS)
  np.testing.assert_array_equal(model(TOKENS, deterministic=True), quiet)
  first, second = model(TOKENS, deterministic=False), model(TOKENS, deterministic=False)
  assert np.all(np.isfinite(first)) and not np.allclose(first, quiet)
  assert not np.allclose(first, second)  # the stream moves on
  np.testing.assert_array_equal(build()(TOKENS, deterministic=False), first)  # same seed
  training = nnx.view(model, deterministic=False)  # a view; the model stays deterministic
  assert not np.allclose(training(TOKENS), quiet)
  np.testing.assert_array_equal(model(TOKENS), quiet)
  model.train()  # flips every deterministic attribute
  assert not model.deterministic and not model.encoder.block_0.attention.deterministic
  assert not np.allclose(model(TOKENS), quiet)
  model.eval()
  np.testing.assert_array_equal(model(TOKENS), quiet)

  # Attention dropout alone, in a jitted training step.
  attention = ajnnx.MultiHeadAttention(2, 16, dropout_rate=0.5, deterministic=False,
                                       rngs=nnx.Rngs(dropout=_key(3), params=_key(4)))
  x = _normal((2, 8, 16), 0)

  @nnx.jit
  def step(layer, x):
    return nnx.value_and_grad(lambda layer: jnp.sum(layer(x) ** 2))(layer)

  (loss_a, grads), (loss_b, _) = step(attention, x), step(attention, x)
  assert loss_a != loss_b  # a new mask each step
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert_close(attention(x, deterministic=True),
               aj.multi_head_attention(ajnnx.linen_params(attention), x), 1e-6)


def test_an_ensemble_built_with_vmap_runs_under_jit_and_vmap():
  config = aj.EncoderConfig(**{**SMALL, "num_layers": 1}, **CONFIGS[3])  # rope, pre-LN, CLS

  @nnx.split_rngs(splits=3)
  @nnx.vmap(in_axes=0, out_axes=0)
  def ensemble(rngs):
    return nnx_encoder.SequenceClassifier(config, rngs=rngs)

  @nnx.jit
  @nnx.vmap(in_axes=(0, None))
  def forward(model, tokens):
    return model(tokens)

  models = ensemble(_rngs(0))
  logits = forward(models, TOKENS)
  assert logits.shape == (3, 2, 3)
  params = ajnnx.linen_params(models)
  assert params["logits"]["kernel"].shape == (3, 16, 3)
  linen = aj.SequenceClassifier(config)
  for member in range(3):
    member_params = jax.tree.map(lambda p: p[member], params)
    assert_close(logits[member], linen.apply({"params": member_params}, TOKENS), 1e-5)
  assert not np.allclose(logits[0], logits[1])  # each member has its own weights


@pytest.mark.parametrize("options", [CONFIGS[3], CONFIGS[2]], ids=["rope-pre_ln", "learned"])
def test_scan_over_a_vmapped_block_stack_equals_the_unrolled_encoder(options):
  config = aj.EncoderConfig(**SMALL, **options)
  encoder = nnx_encoder.TransformerEncoder(config, rngs=_rngs(0))
  encoder_params = ajnnx.linen_params(encoder)

  @nnx.split_rngs(splits=config.num_layers)
  @nnx.vmap(in_axes=0, out_axes=0)
  def stack(rngs):
    return nnx_encoder.EncoderBlock(config, rngs=rngs)

  blocks = stack(_rngs(1))  # layer axis first: then the encoder's weights, stacked
  ajnnx.load_linen_params(blocks, jax.tree.map(
      lambda *layers: jnp.stack(layers),
      *[encoder_params[f"block_{i}"] for i in range(config.num_layers)]))

  @nnx.jit
  def scanned(blocks, encoder, tokens):
    x, mask, bias = encoder.embed_inputs(tokens)

    @nnx.scan(in_axes=(0, nnx.Carry, None, None), out_axes=nnx.Carry)
    def layer(block, x, mask, bias):
      return block(x, mask, bias)

    x = layer(blocks, x, mask, bias)
    return encoder.final_norm(x) if config.pre_layer_norm else x

  assert_close(scanned(blocks, encoder, TOKENS), encoder(TOKENS), 1e-5)


def test_weights_that_do_not_fit_and_linen_attention_modules_are_refused():
  small = nnx_encoder.TransformerEncoder(aj.EncoderConfig(**SMALL), rngs=_rngs(0))

  def linen_variables(**changes):  # zeros of the shapes a Linen encoder would make
    linen = aj.TransformerEncoder(aj.EncoderConfig(**{**SMALL, **changes}))
    shapes = jax.eval_shape(linen.init, jax.random.key(0), TOKENS)
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

  with pytest.raises(ValueError, match="unexpected.*block_2"):
    ajnnx.load_linen_params(small, linen_variables(num_layers=3))
  with pytest.raises(ValueError, match=r"feed_forward/hidden/kernel \(16, 32\) != \(16, 64\)"):
    ajnnx.load_linen_params(small, linen_variables(mlp_dim=64))
  linen_attention = aj.EncoderConfig(**SMALL, attention_module=aj.MultiHeadAttention)
  with pytest.raises(ValueError, match="attention_module"):
    nnx_encoder.TransformerEncoder(linen_attention, rngs=_rngs(0))


def test_the_example_s_docstrings_run_and_its_blocks_scale_w_q_as_linen_s():
  flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  results = doctest.testmod(nnx_encoder, optionflags=flags)
  assert results.attempted and not results.failed
  # query_init_scale: lecun normal's draw times the scale, as the Linen block's query_kernel_init
  kernels = [ajnnx.linen_params(nnx_encoder.EncoderBlock(
      aj.EncoderConfig(**SMALL, query_init_scale=scale), rngs=_rngs(0)))["attention"]["query"]
             for scale in (1.0, 0.01)]
  assert_close(kernels[1]["kernel"], 0.01 * kernels[0]["kernel"], 1e-6)
  np.testing.assert_array_equal(kernels[1]["bias"], kernels[0]["bias"])


def test_the_package_imports_the_nnx_shells_only_when_asked():
  assert aj.nnx is ajnnx
  code = ("import sys, attention_jax; before = 'flax.nnx' in sys.modules; "
          "attention_jax.nnx.MultiHeadAttention; print(before, 'flax.nnx' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
  assert result.stdout.split() == ["False", "True"]


def test_the_nnx_layer_sows_its_maps_beside_the_row_maxima_it_returns():
  x = jax.random.normal(jax.random.key(0), (2, 6, 16))
  layer = ajnnx.MultiHeadAttention(4, 16, rngs=nnx.Rngs(0))
  y, largest = layer(x, sow_weights=True, return_max_scores=True)
  weights = layer.attention_weights[0]
  logits, want = aj.attention_maps(ajnnx.linen_params(layer), x)
  assert_close(weights, want, rtol=1e-6)
  assert_close(y, layer(x), rtol=1e-6)
  assert_close(largest, jnp.swapaxes(jnp.max(logits, axis=-1), -1, -2), rtol=1e-5)
