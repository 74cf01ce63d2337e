"""Head variants (talking heads, DCMHA, MoH, overlapping heads) against a NumPy loop over heads and
positions, their identity settings, masks and causality, parameter transfer, and refusals."""

import doctest

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import nnx as ajnnx
from attention_jax import variants
from attention_jax.variants import dcmha
from conftest import assert_close, redrawn

D_IN, HEADS, T = 12, 4, 6
MIXING = [name for name, cls in variants.REGISTRY.items() if cls.forms_maps]
OPTIONS = {"moh": {"shared_heads": 1, "routed_heads": 2}}  # head_variant_options
VARIANTS = {
    "talking_heads": variants.get("talking_heads"),
    "dcmha": variants.get("dcmha"),
    "moh": variants.get("moh", **OPTIONS["moh"]),
    "overlap": variants.get("overlap", overlap=2),
}


def _x(seed=0, shape=(2, T, D_IN)):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _params(variant, seed=1, **options):
  """The layer and its parameters redrawn at unit-ish scale (conftest.redrawn)."""
  layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variant, **options)
  return layer, redrawn(layer.init(jax.random.key(seed), _x())["params"], seed + 1)


# ------------------------------------------------------------------------------------------------
# The NumPy loop: every head, position and pair written out, float64.

def _gelu(x):  # jax.nn.gelu's default tanh approximation, as DCFormer's flax nn.gelu
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax_row(logits, allowed):
  if not allowed.any():
    return np.zeros_like(logits)
  e = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
  return e / e.sum()


def _dcmha_weights_numpy(p, x):
  """{part: (w1 [L, I, N], w2 [L, I, N], dd [L, N])} for one sequence x [L, D], row by row."""
  out = {}
  for c, part in enumerate(dcmha.PARTS):
    w1, w2, dd = [], [], []
    for row in x:
      hidden = _gelu(row @ p["dw1"][:, c, :])  # [K]
      w = np.einsum("k,kim->im", hidden, p["qkw"][c])  # [2I, N]
      a = w[:dcmha.rank(HEADS)]
      w1.append(a / np.sqrt((a ** 2).mean(-1, keepdims=True) + 1e-6))
      w2.append(w[dcmha.rank(HEADS):])
      dd.append(np.tanh(row @ p["dd"][:, c, :]))
    out[part] = (np.array(w1), np.array(w2), np.array(dd))
  return out


def _compose_numpy(maps, static, query_wise, key_wise):
  """DCFormer's CrossHeadProjection, one (m, t, s) at a time."""
  (qw1, qw2, qdd), (kw1, kw2, kdd) = query_wise, key_wise
  n_heads, q_len, k_len = maps.shape
  out = np.zeros_like(maps)
  for m in range(n_heads):
    for t in range(q_len):
      for s in range(k_len):
        total = maps[m, t, s] * (1 + qdd[t, m] + kdd[s, m])
        for n in range(n_heads):
          coefficient = static[n, m]
          coefficient += sum(qw1[t, i, n] * qw2[t, i, m] for i in range(qw1.shape[1]))
          coefficient += sum(kw1[s, i, n] * kw2[s, i, m] for i in range(kw1.shape[1]))
          total += maps[n, t, s] * coefficient
        out[m, t, s] = total
  return out


def _moh_gates_numpy(p, x, shared, k):
  """MoH-ViT's gates for each token of x [L, D]."""
  def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()
  gates = []
  for row in x:
    probs = softmax(row @ p["router"])
    top = np.argsort(-probs, kind="stable")[:k]
    routed = np.zeros_like(probs)
    routed[top] = probs[top] / probs[top].sum() * k
    if shared == 0:
      gates.append(routed)
      continue
    shared_gates = softmax(row @ p["shared_router"]) * shared if shared > 1 else np.ones(1)
    mix = softmax(row @ p["mix_router"]) * 2
    gates.append(np.concatenate([shared_gates * mix[0], routed * mix[1]]))
  return np.array(gates)


def layer_numpy(params, x, variant, *, mask=None, bias=None, is_causal=False):
  """The layer's output [B, T, D_out] and applied weights [B, N, T, T], loop by loop."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  name = "mha" if variant is None else variant.name
  batch, length, _ = x.shape
  head_dim = p["query"]["kernel"].shape[-1]
  overlap = variant.overlap if name == "overlap" else 0
  width = head_dim + 2 * overlap
  outputs, all_weights = [], []
  for b in range(batch):
    projected = {part: x[b] @ p[part]["kernel"].reshape(D_IN, -1) + p[part]["bias"].reshape(-1)
                 for part in ("query", "key", "value")}  # [L, N * H]
    heads = {part: np.zeros((length, HEADS, width)) for part in projected}
    for part, flat in projected.items():
      for n in range(HEADS):
        for j in range(width):
          feature = n * head_dim - overlap + j
          if 0 <= feature < HEADS * head_dim:
            heads[part][:, n, j] = flat[:, feature]
    logits = np.zeros((HEADS, length, length))
    for n in range(HEADS):
      for t in range(length):
        for s in range(length):
          logits[n, t, s] = heads["query"][t, n] @ heads["key"][s, n] / np.sqrt(head_dim)
    if name == "talking_heads":
      logits = np.einsum("nts,nm->mts", logits, p["talking_heads"]["logits_mix"])
    if name == "dcmha":
      dynamic = _dcmha_weights_numpy(p["dcmha"], x[b])
      logits = _compose_numpy(logits, p["dcmha"]["pre_static"], dynamic["pre_query"],
                              dynamic["pre_key"])
    if bias is not None:
      logits = logits + np.broadcast_to(np.asarray(bias, np.float64), logits.shape)
    allowed = np.ones((HEADS, length, length), bool)
    if mask is not None:
      allowed &= np.broadcast_to(np.asarray(mask)[b], allowed.shape)
    if is_causal:
      allowed &= np.tril(np.ones((length, length), bool))
    weights = np.array([[_softmax_row(logits[n, t], allowed[n, t]) for t in range(length)]
                        for n in range(HEADS)])
    if name == "talking_heads":
      weights = np.einsum("nts,nm->mts", weights, p["talking_heads"]["weights_mix"])
    if name == "dcmha":
      weights = _compose_numpy(weights, p["dcmha"]["post_static"], dynamic["post_query"],
                               dynamic["post_key"])
    weights = np.where(allowed, weights, 0.0)
    out = np.einsum("nts,snh->tnh", weights, heads["value"])  # [T, N, width]
    if name == "moh":
      shared, k, _ = variant.moh_heads(HEADS)
      out = out * _moh_gates_numpy(p["moh"], x[b], shared, k)[:, :, None]
    outputs.append(out.reshape(length, -1) @ p["out"]["kernel"].reshape(HEADS * width, -1)
                   + p["out"]["bias"])
    all_weights.append(weights)
  return np.array(outputs), np.array(all_weights)


# ------------------------------------------------------------------------------------------------

def _padding_and_bias():
  valid = np.ones((2, T), bool)
  valid[1, 4:] = False
  mask = aj.padding_mask(jnp.asarray(valid))  # [B, 1, 1, T]
  return mask, aj.alibi_bias(HEADS, T, T)  # [N, T, T]


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("is_causal", [False, True])
def test_each_variant_equals_a_numpy_loop_with_padding_alibi_and_causality(name, is_causal):
  variant = VARIANTS[name]
  layer, params = _params(variant)
  x = _x()
  mask, bias = _padding_and_bias()
  y, state = layer.apply({"params": params}, x, mask=mask, bias=bias, is_causal=is_causal,
                         sow_weights=True, mutable="intermediates")
  expected, weights = layer_numpy(params, x, variant, mask=mask, bias=bias, is_causal=is_causal)
  assert_close(y, expected, rtol=2e-5, name=name)
  # the captured weights are the ones applied (mixed and signed for talking heads and DCMHA)
  assert_close(state["intermediates"]["attention_weights"][0], weights, rtol=2e-5, name=name)
  if name in MIXING:
    assert np.min(weights) < 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_at_its_identity_setting_is_multi_head_attention(name):
  variant = VARIANTS[name]
  layer, params = _params(variant)
  if name == "talking_heads":
    params["talking_heads"] = {key: jnp.eye(HEADS) for key in params["talking_heads"]}
  if name == "dcmha":  # the composition's parameters at zero; dw1 stays random
    params["dcmha"] = {key: value if key == "dw1" else jnp.zeros_like(value)
                       for key, value in params["dcmha"].items()}
  if name == "moh":  # a zero router, every routed head chosen
    variant = variants.get("moh", shared_heads=1, routed_heads=HEADS - 1)
    layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variant)
    params["moh"] = {key: jnp.zeros_like(value) for key, value in params["moh"].items()}
  if name == "overlap":  # overlap 0: the heads as they were; W_O back to [N, H, D]
    variant = variants.get("overlap", overlap=0)
    layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variant)
    params["out"]["kernel"] = params["out"]["kernel"][:, 2:-2]
  plain = {key: value for key, value in params.items() if key not in variants.REGISTRY}
  x = _x()
  mask, bias = _padding_and_bias()
  y = layer.apply({"params": params}, x, mask=mask, bias=bias, is_causal=True)
  mha = aj.MultiHeadAttention(num_heads=HEADS).apply({"params": plain}, x, mask=mask, bias=bias,
                                                     is_causal=True)
  assert_close(y, mha, rtol=1e-6, name=name)


@pytest.mark.parametrize("name", ["talking_heads", "dcmha"])
def test_permuting_the_heads_permutes_the_mixes_and_a_transposed_mix_is_caught(name):
  """Relabelling the heads by a permutation (projections, W_O and the mixing matrices alike)
  leaves the output unchanged; the transposed matrices do not, so a mix applied the wrong way
  round cannot pass the loop comparison above."""
  variant = VARIANTS[name]
  layer, params = _params(variant)
  permutation = np.array([2, 0, 3, 1])
  permuted = jax.tree.map(lambda a: a, params)
  for part in ("query", "key", "value"):
    permuted[part] = {"kernel": params[part]["kernel"][:, permutation],
                      "bias": params[part]["bias"][permutation]}
  permuted["out"] = {**params["out"], "kernel": params["out"]["kernel"][permutation]}
  matrices = {"talking_heads": ("logits_mix", "weights_mix"),
              "dcmha": ("pre_static", "post_static")}[name]
  for key in matrices:
    permuted[name][key] = params[name][key][permutation][:, permutation]
  if name == "dcmha":  # the dynamic network's head axis is the last one of qkw and dd
    permuted[name]["qkw"] = params[name]["qkw"][..., permutation]
    permuted[name]["dd"] = params[name]["dd"][..., permutation]
  x = _x()
  y = layer.apply({"params": params}, x, is_causal=True)
  assert_close(layer.apply({"params": permuted}, x, is_causal=True), y, rtol=1e-5)
  transposed = {**params, name: {**params[name], **{key: params[name][key].T
                                                   for key in matrices}}}
  assert np.max(np.abs(layer.apply({"params": transposed}, x, is_causal=True) - y)) > 1e-3


def test_moh_routes_each_token_to_its_shared_heads_and_k_others():
  for shared, k in ((0, 2), (1, 2), (2, 1), (2, 2)):
    variant = variants.get("moh", shared_heads=shared, routed_heads=k)
    layer, params = _params(variant)
    _, state = layer.apply({"params": params}, _x(), sow_weights=True, mutable="intermediates")
    gates = np.asarray(state["intermediates"]["head_gates"][0])  # [B, T, N]
    assert np.all(np.sum(gates != 0, axis=-1) == shared + k), (shared, k)
    assert np.all(gates[..., :shared] != 0)  # the shared heads are the first ones
    usage = aj.diagnostics.head_usage(jnp.asarray(gates))
    np.testing.assert_allclose(np.sum(usage), shared + k, rtol=1e-6)


def test_load_balancing_loss_equals_its_value_at_a_uniform_router():
  variant = variants.get("moh", shared_heads=1, routed_heads=2)
  layer, params = _params(variant)
  routed = HEADS - 1
  x = _x()
  uniform = {**params, "moh": {**params["moh"], "router": jnp.zeros_like(params["moh"]["router"])}}
  _, state = layer.apply({"params": uniform}, x, mutable=variants.LOSSES)
  # at a uniform router the loss is k, whichever heads the ties choose
  np.testing.assert_allclose(state[variants.LOSSES]["load_balancing"][0], 0.01 * 2, rtol=1e-6)
  _, state = layer.apply({"params": params}, x, mutable=variants.LOSSES)
  p = np.asarray(params["moh"]["router"], np.float64)
  probs = np.array([np.exp(r @ p) / np.exp(r @ p).sum() for r in np.asarray(x).reshape(-1, D_IN)])
  chosen = np.zeros_like(probs)
  for row, top in zip(chosen, np.argsort(-probs, axis=-1)[:, :2]):
    row[top] = 1.0
  expected = routed * np.sum(probs.mean(0) * chosen.mean(0))
  np.testing.assert_allclose(state[variants.LOSSES]["load_balancing"][0], 0.01 * expected,
                             rtol=1e-5)


def test_a_layer_takes_a_variant_by_name_and_refuses_what_is_not_one():
  x = _x()
  by_name = aj.MultiHeadAttention(num_heads=HEADS, head_variant="gated")
  by_object = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variants.get("gated"))
  params = by_object.init(jax.random.key(0), x)
  assert jax.tree.structure(by_name.init(jax.random.key(0), x)) == jax.tree.structure(params)
  assert_close(by_name.apply(params, x), by_object.apply(params, x), rtol=0)
  twin = ajnnx.MultiHeadAttention(HEADS, D_IN, head_variant="gated", rngs=nnx.Rngs(0))
  assert_close(ajnnx.load_linen_params(twin, params)(x), by_object.apply(params, x), rtol=1e-6)
  with pytest.raises(ValueError, match="unknown head variant 'gate'"):
    aj.MultiHeadAttention(num_heads=HEADS, head_variant="gate").init(jax.random.key(0), x)
  with pytest.raises(TypeError, match="head_variant must be a variants.Variant, its name or None"):
    aj.MultiHeadAttention(num_heads=HEADS, head_variant=variants.variant_class("gated")).init(jax.random.key(0), x)


def test_mixing_variants_choose_an_implementation_that_forms_every_heads_logits():
  layer, params = _params(VARIANTS["talking_heads"])
  long = _x(shape=(1, 260, D_IN))  # on CPU dot_product_attention picks "chunked" from 256 on
  assert aj.select_implementation(jnp.zeros((1, 260, HEADS, 3)), jnp.zeros((1, 260, HEADS, 3)),
                                  jnp.zeros((1, 260, HEADS, 3)), backend="cpu") == "chunked"
  automatic = layer.apply({"params": params}, long, is_causal=True)
  named = aj.MultiHeadAttention(num_heads=HEADS, head_variant=VARIANTS["talking_heads"],
                                implementation="reference")
  assert_close(automatic, named.apply({"params": params}, long, is_causal=True), rtol=1e-6)
  for implementation in ("chunked", "xla"):
    refusing = aj.MultiHeadAttention(num_heads=HEADS, head_variant=VARIANTS["talking_heads"],
                                     implementation=implementation)
    with pytest.raises(ValueError, match=f"implementation='{implementation}' cannot serve") as e:
      refusing.apply({"params": params}, _x())
    assert "\n" not in str(e.value)


def test_mixing_variants_serve_sequence_lengths_and_windows_as_the_reference_masks_them():
  layer, params = _params(VARIANTS["dcmha"])
  x = _x()
  lengths = jnp.array([6, 3])
  y = layer.apply({"params": params}, x, key_value_seq_lengths=lengths, local_window_size=2)
  mask = aj.structure_mask(None, T, T, key_value_seq_lengths=lengths, local_window_size=2)
  mask = np.broadcast_to(mask, (2, HEADS, T, T))
  assert_close(y, layer_numpy(params, x, VARIANTS["dcmha"], mask=mask)[0], rtol=2e-5)


def test_what_a_variant_cannot_serve_is_refused_in_one_line():
  x = _x()
  query = jnp.zeros((2, T, HEADS, 3))
  key = jnp.zeros((2, T, 2, 3))  # grouped key/value heads
  cases = [
      (lambda: variants.get("overlap", overlap=1).layout(query, key, key),
       "num_kv_heads"),
      (lambda: _params(VARIANTS["dcmha"])[0].apply({"params": _params(VARIANTS["dcmha"])[1]},
                                                    x, _x(seed=3)), "inputs_kv=None"),
      (lambda: variants.get("moh").moh_heads(2), "num_heads >= 4"),
      (lambda: variants.get("talking"), "unknown head variant"),
      (lambda: aj.EncoderConfig(vocab_size=8, head_variant="moh", num_heads=2, d_model=8),
       "MoH needs"),
      (lambda: aj.EncoderConfig(vocab_size=8, head_variant="overlap",
                                head_variant_options={"schedule": "x"}),
       "unknown overlap schedule"),
      (lambda: aj.EncoderConfig(vocab_size=8, head_variant="overlap",
                                head_variant_options={"shared_heads": 1}), "the option 'schedule'"),
  ]
  for call, words in cases:
    with pytest.raises(ValueError, match=words) as error:
      call()
    assert "\n" not in str(error.value)


def test_the_config_check_refuses_a_mixing_variant_with_a_blockwise_kernel():
  from configs import default
  from experiments import config_check
  config = default.get_config()
  config.model.head_variant = "talking_heads"
  config.model.attention_impl = "chunked"
  with pytest.raises(config_check.ConfigError,
                     match="forms every head's logits.*attention_impl='chunked' never forms"):
    config_check.validate(config)
  config.model.attention_impl = ""
  config.model.head_variant = "moh"
  config.model.num_heads = 2
  with pytest.raises(config_check.ConfigError, match="model.head_variant='moh': MoH needs"):
    config_check.validate(config)


def test_moh_adds_its_load_balancing_loss_to_the_training_loss():
  config = aj.EncoderConfig(vocab_size=11, d_model=16, num_heads=HEADS, num_layers=2,
                            num_classes=5, max_length=T, head_variant="moh")
  model = aj.TokenClassifier(config)
  tokens = jnp.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 1, 2, 3]])
  params = model.init(jax.random.key(0), tokens)["params"]
  logits, sown = model.apply({"params": params}, tokens, mutable=variants.LOSSES)
  terms = jax.tree.leaves(sown)
  assert len(terms) == 2  # one per layer, each 0.01 x a loss of at least 1 (k = 1 at N = 4)
  assert all(0.01 <= float(term) for term in terms)
  np.testing.assert_allclose(variants.auxiliary_loss(sown), np.mean(terms), rtol=1e-6)
  del logits


@pytest.mark.parametrize("module", [variants.base, variants.talking_heads, variants.dcmha,
                                    variants.moh, variants.overlap, variants.gated,
                                    variants.differential])
def test_the_module_docstring_examples_run(module):
  failures, tried = doctest.testmod(module, extraglobs={"jnp": jnp, "jax": jax}, verbose=False)
  assert tried >= 1 and failures == 0


@pytest.mark.parametrize("mode", [None, "quick", "order_4", "order_16", "order_16_quick"])
def test_the_ablation_configs_are_valid_and_a_bad_mode_is_refused(mode):
  from configs.ablations import head_variants as ablation
  from experiments import sweep
  config = ablation.get_config(mode)
  sweep.check(config)
  assert config.num_seeds == (2 if mode and mode.endswith("quick") else ablation.NUM_SEEDS)
  order = (mode or "").startswith("order")
  assert len(config.grid.learning_rate) == (2 if mode and mode.endswith("quick") else
                                            3 if order else 4)
  assert ("length_17_32" in config.extra_evals) == order
  assert "validation" in config.extra_evals
  # order: one sweep per head count, every comparison within it
  heads = {overrides["model"]["num_heads"] for _, overrides in config.variants}
  assert heads == ({16} if "16" in (mode or "") else {4} if order else {4, 16})
  with pytest.raises(ValueError, match="mode must be one of"):
    ablation.get_config("listops")


def test_the_matched_baseline_has_as_many_parameters_as_dcmha():
  from configs.ablations import head_variants as ablation
  from experiments import config_check, sweep, tasks
  config = ablation.get_config()
  task = tasks.Task(name="shapes", train=None, test=None, vocab_size=20, num_classes=8,
                    max_length=8, token_names=())
  counts = {}
  for name, overrides in config.variants:
    model = aj.TokenClassifier(config_check.encoder_config(
        sweep.variant_config(config, overrides), task))
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    counts[name] = sum(leaf.size for leaf in jax.tree.leaves(shapes["params"]))
  assert abs(counts["dcmha_16"] - counts["mha_matched_16"]) / counts["dcmha_16"] < 0.01
  assert counts["dcmha_16"] > 1.5 * counts["mha_16"]  # why it needs the baseline
  assert counts["overlap_4"] > counts["mha_4"] == counts["mha_16"]  # W_O grows in layer 1


def test_the_ablation_runs_tiny(data_dir, tmp_path):
  from configs.ablations import head_variants as ablation
  from experiments import sweep, sweep_report, verdicts
  config = ablation.get_config("quick")
  config.train.update(data_dir=data_dir, num_train_steps=2, eval_every_steps=2,
                      checkpoint_every_steps=2, log_every_steps=1, warmup_steps=1, batch_size=8)
  config.train.task_options.update(num_train=64, num_test=16)
  config.num_seeds = 1
  config.variants = tuple(v for v in config.variants if v[0] == "dcmha_16")
  config.baseline, config.contrasts = "dcmha_16", ()
  (record,) = sweep.run_sweep(config, str(tmp_path))
  assert record["status"] == "ok", record
  design = verdicts.Design.of_sweep(config, "accuracy")
  report = open(sweep_report.write([record], str(tmp_path), design)["markdown"]).read()
  assert f"| {record['metrics']['parameters'][0]} |" in report  # the parameter column


def test_benchmark_train_times_the_head_variants_beside_mha():
  import importlib
  benchmark = importlib.import_module("scripts.benchmark_train")
  size = (4, 9, 16, 4, 1, 32)  # (B, T with CLS, D, N, L, mlp)
  steps = benchmark.runners(["attention_jax", "attention_jax+dcmha"], size, "float32")
  assert steps["attention_jax+dcmha"].parameters > steps["attention_jax"].parameters
  times = benchmark.measure(steps, rounds=1, seconds=0.01)
  assert set(times) == set(steps) and all(min(t) > 0 for t in times.values())


def test_a_variant_class_needs_its_own_name_and_a_registered_name_is_not_overwritten():
  with pytest.raises(TypeError, match="no name of its own") as error:
    class Nameless(variants.Variant):  # noqa: F841 (refused as it is defined)
      def heads(self, state, heads):
        return -heads
  assert "\n" not in str(error.value)

  class Named(variants.Variant):
    name = "mha"  # its own, but registered to plain MHA already
  for cls in (Named, type("Twin", (variants.Variant,), {"name": "gated"})):
    with pytest.raises(ValueError, match=f"name '{cls.name}' is registered already") as error:
      variants.register(cls)
    assert "\n" not in str(error.value)
  assert variants.REGISTRY["mha"] is variants.Variant and variants.get("gated").name == "gated"
  assert variants.register(variants.REGISTRY["gated"]) is variants.REGISTRY["gated"]  # again: kept


def test_no_variant_has_a_normalize_hook():
  """The softmax belongs to the attention call (sinks, sigmoid); no variant replaced it."""
  assert "normalize" not in variants.base.MAP_HOOKS
  assert not any(hasattr(cls, "normalize") for cls in variants.REGISTRY.values())
