"""Malformed calls raise ValueError at trace time, naming the problem."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick

Q = jnp.zeros((2, 4, 4, 8))  # [B, T, N, H]
KV = jnp.zeros((2, 6, 2, 8))  # [B, S, K, H]


def attention(**overrides):
  args = dict(query=Q, key=KV, value=KV)
  args.update(overrides)
  return aj.dot_product_attention(**args)


MALFORMED = {
    "rank_mismatch": (dict(key=jnp.zeros((6, 2, 8))), "same rank"),
    "rank_too_small": (dict(query=jnp.zeros((4, 8))), r"rank >= 3"),
    "head_dim_mismatch": (dict(key=jnp.zeros((2, 6, 2, 16))), "same head_dim"),
    "kv_length_mismatch": (dict(value=jnp.zeros((2, 5, 2, 8))), "same length"),
    "heads_not_multiple": (dict(key=jnp.zeros((2, 6, 3, 8)), value=jnp.zeros((2, 6, 3, 8))),
                           "multiple of key/value heads"),
    "batch_mismatch": (dict(key=jnp.zeros((3, 6, 2, 8)), value=jnp.zeros((3, 6, 2, 8))),
                       "leading batch dims"),
    "dtype_mismatch": (dict(key=KV.astype(jnp.bfloat16)), "one dtype"),
    "integer_inputs": (dict(query=Q.astype(jnp.int32), key=KV.astype(jnp.int32),
                            value=KV.astype(jnp.int32)), "floating dtype"),
    "mask_not_broadcastable": (dict(mask=jnp.ones((2, 4, 4, 5), bool)), "mask of shape"),
    "mask_too_many_dims": (dict(mask=jnp.ones((1, 2, 4, 4, 6), bool)), "mask of shape"),
    "mask_per_token": (dict(mask=jnp.ones((2, 6), bool)),
                       r"aj\.padding_mask\(valid\), or pass the lengths as key_value_seq_lengths"),
    "bias_not_broadcastable": (dict(bias=jnp.zeros((3, 4, 6))), "bias of shape"),
    "unknown_implementation": (dict(implementation="flash"), "implementation must be one of"),
    "xla_cannot_drop_out": (dict(implementation="xla", dropout_rate=0.1,
                                 dropout_rng=jax.random.key(0)), "no attention dropout"),
    "chunked_cannot_return_weights": (dict(implementation="chunked", return_weights=True),
                                      "cannot return them"),
    "xla_cannot_return_weights": (dict(implementation="xla", return_weights=True),
                                  "never forms the weights, so it cannot return them"),
    "dropout_without_rng": (dict(dropout_rate=0.1), "needs a dropout_rng"),
    "dropout_rate_out_of_range": (dict(dropout_rate=1.0, dropout_rng=jax.random.key(0)),
                                  r"dropout_rate must be in \[0, 1\)"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_call_raises_value_error_naming_the_problem(case):
  overrides, message = MALFORMED[case]
  with pytest.raises(ValueError, match=message):
    attention(**overrides)


def test_errors_are_raised_at_trace_time_under_jit():
  with pytest.raises(ValueError, match="same head_dim"):
    jax.jit(aj.dot_product_attention).lower(Q, jnp.zeros((2, 6, 2, 16)), jnp.zeros((2, 6, 2, 16)))


def test_shape_message_names_expected_and_actual():
  with pytest.raises(ValueError) as error:
    attention(mask=jnp.ones((2, 4, 4, 5), bool))
  assert "(2, 4, 4, 5)" in str(error.value) and "(2, 4, 4, 6)" in str(error.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=3, qkv_features=32), "num_heads=3 must divide qkv_features=32"),
    (dict(num_heads=4, scale="sqrt"), "unknown attention scale"),
    (dict(num_heads=4, scale=None), "must be a number or a name"),
])
def test_multihead_configuration_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    aj.MultiHeadAttention(**kwargs).init(jax.random.key(0), jnp.zeros((1, 3, 32)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=30, num_heads=4), "num_heads=4 must divide d_model=30.*or set head_dim"),
    (dict(positional_encoding="relative"), "unknown positional encoding"),
    (dict(attention_scale="huge"), "unknown attention scale"),
    (dict(pooling="max"), "pooling must be one of"),
    (dict(dropout_rate=1.5), "dropout_rate must be in"),
    (dict(num_layers=0), "num_layers must be positive"),
])
def test_encoder_config_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    aj.EncoderConfig(vocab_size=16, **kwargs)


def test_unknown_positional_encoding_lists_known_names():
  with pytest.raises(ValueError, match="alibi.*learned.*none.*rope.*sinusoidal"):
    aj.positional_encoding("absolute", max_length=8, num_heads=2)


def test_learned_encoding_too_short_says_what_to_do():
  config = aj.EncoderConfig(vocab_size=16, d_model=16, num_heads=2, max_length=4,
                            positional_encoding="learned")
  with pytest.raises(ValueError, match="raise max_length"):
    aj.TransformerEncoder(config).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))


def test_sinusoidal_odd_dim():
  with pytest.raises(ValueError, match="even dim"):
    aj.sinusoidal_encoding(4, 7)


def test_rope_with_an_odd_head_dim_is_refused_before_training():
  from experiments import config_check
  config = config_check.default_config()
  config.model.positional_encoding, config.model.d_model, config.model.num_heads = "rope", 64, 64
  with pytest.raises(config_check.ConfigError, match="d_k must be even, got d_k=1"):
    config_check.validate(config)
  with pytest.raises(ValueError, match="d_k must be even"):
    aj.EncoderConfig(vocab_size=8, d_model=64, num_heads=64, positional_encoding="rope")


@pytest.mark.parametrize("schedule, warmup, steps, warns", [
    ("warmup_cosine", 100, 20, True), ("noam", 20, 20, True), ("warmup_cosine", 19, 20, False),
    ("constant", 100, 20, False)])
def test_a_warmup_not_shorter_than_the_run_says_so_in_one_line(schedule, warmup, steps, warns):
  import warnings
  from experiments import config_check
  config = config_check.default_config()
  config.schedule, config.warmup_steps, config.num_train_steps = schedule, warmup, steps
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    config_check.validate(config)
  found = [w for w in caught if issubclass(w.category, config_check.ConfigWarning)]
  assert len(found) == warns
  if warns:
    message = str(found[0].message)
    assert "\n" not in message and f"warmup_steps={warmup}" in message
    assert f"num_train_steps={steps}" in message and "--config.warmup_steps=2" in message


@pytest.mark.parametrize("flags, kind, capability, dtype, implementation, refused", [
    ("--xla_gpu_deterministic_ops=true", "NVIDIA H200", "9.0", "bfloat16", "", True),
    ("--xla_gpu_exclude_nondeterministic_ops", "NVIDIA H100", "9.0", "bfloat16", "", True),
    ("--xla_gpu_deterministic_ops=true", "NVIDIA H200", "9.0", "float32", "", False),
    ("--xla_gpu_deterministic_ops=true", "NVIDIA H200", "9.0", "bfloat16", "xla", False),
    ("--xla_gpu_deterministic_ops=true", "NVIDIA H200", "9.0", "float32", "cudnn", True),
    ("--xla_gpu_deterministic_ops=true", "NVIDIA A100", "8.0", "bfloat16", "", False),
    ("--xla_gpu_deterministic_ops=false", "NVIDIA H200", "9.0", "bfloat16", "", False),
    ("", "NVIDIA H200", "9.0", "bfloat16", "", False),
])
def test_gpu_determinism_flags_that_would_crash_beside_cudnn_are_refused_in_one_line(
    flags, kind, capability, dtype, implementation, refused):
  """On an H200 either flag made XLA fail to compile a bfloat16 step with cuDNN attention."""
  from experiments import config_check
  config = config_check.default_config()
  config.compute_dtype, config.model.attention_impl = dtype, implementation
  device = types.SimpleNamespace(platform="gpu", device_kind=kind, compute_capability=capability)
  check = lambda: config_check.check_gpu_determinism_flags(config, flags, device)
  if refused:
    with pytest.raises(config_check.ConfigError, match="train in float32 .* or unset it"):
      check()
  else:
    check()
  cpu = types.SimpleNamespace(platform="cpu", device_kind="cpu")
  config_check.check_gpu_determinism_flags(config, flags, cpu)  # never on a CPU


def test_the_run_config_s_model_errors_are_the_model_config_s_own_in_one_line():
  """One check: validation builds the library's EncoderConfig, so each of its errors reaches the
  run as a one-line ConfigError naming the config field, with the library's own words."""
  from experiments import config_check
  for field, value in (("pooling", "max"), ("num_layers", 0), ("d_model", 30),
                       ("attention_impl", "flash"), ("positional_encoding", "absolute"),
                       ("query_init_scale", -1.0), ("head_variant", "talking")):
    config = config_check.default_config()
    config.model[field] = value
    expected = None
    try:
      config_check.encoder_config(config)
    except config_check.ConfigError as error:
      expected = str(error)
    kwargs = {"d_model": 128, "num_heads": 4, field: value}
    with pytest.raises(ValueError) as library:
      aj.EncoderConfig(vocab_size=8, **{**kwargs, field: value})
    with pytest.raises(config_check.ConfigError) as run:
      config_check.validate(config)
    assert str(run.value) == expected and str(library.value) in expected, field
    assert expected.startswith("model.") and "\n" not in expected, expected


def test_deprecated_variant_fields_still_work_for_one_release_with_one_line():
  import warnings
  from experiments import config_check
  config = config_check.default_config()
  config.model.head_variant, config.model.moh_shared_heads = "moh", 1
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    config_check.validate(config)
  messages = [str(w.message) for w in caught if issubclass(w.category, config_check.ConfigWarning)]
  assert messages == ["model.moh_shared_heads is deprecated; set "
                      "model.head_variant_options.shared_heads=1 instead."]
  assert config_check.encoder_config(config).head_variant_of(0).shared_heads == 1
  with pytest.warns(DeprecationWarning, match=r"head_variant_options=\{'schedule': 'half_index'\}"):
    model = aj.EncoderConfig(vocab_size=8, head_variant="overlap", overlap_schedule="half_index")
  assert model.head_variant_options == (("schedule", "half_index"),)


def test_every_path_gives_jax_nn_s_answer_on_a_row_with_no_key_by_default():
  """One empty_rows default ("mean"), applied by masks.fill_empty_rows on every path: the kernel
  functions, dot_product_attention and context parallelism give jax.nn's answer on a row with
  no key (the mean of the values) unless empty_rows="zero" asks for zeros; another value is one
  line."""
  from attention_jax import chunked, context_parallel, pallas_gpu
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 2, 8)), jnp.float32) for _ in range(3))
  mask = jnp.ones((1, 1, 8, 8), bool).at[..., 3, :].set(False)  # row 3 has no key
  expected = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=0.5)
  mesh = jax.make_mesh((1,), ("seq",))
  paths = {
      "chunked_attention": lambda **kw: chunked.chunked_attention(q, k, v, mask=mask, scale=0.5,
                                                                 **kw),
      "pallas_gpu_attention": lambda **kw: pallas_gpu.pallas_gpu_attention(
          q, k, v, mask=mask, scale=0.5, interpret=True, **kw),
      "dot_product_attention": lambda **kw: aj.dot_product_attention(
          q, k, v, mask=mask, scale=0.5, implementation="chunked", **kw),
      "ContextParallel": lambda **kw: context_parallel.ContextParallel(mesh, "seq", "all_gather")(
          q, k, v, mask=mask, scale=0.5, **kw)}
  for name, attend in paths.items():
    np.testing.assert_allclose(attend(), expected, rtol=1e-5, atol=1e-6, err_msg=name)
    zeros = attend(empty_rows="zero")
    assert not jnp.any(zeros[:, 3]) and jnp.allclose(zeros[:, :3], expected[:, :3], atol=1e-6)
    with pytest.raises(ValueError, match=r"empty_rows must be one of \('mean', 'zero'\), got "
                                         r"'nan'\."):
      attend(empty_rows="nan")
