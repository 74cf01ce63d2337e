"""Every registered head variant (attention_jax.variants.REGISTRY) against the properties the
plug-in interface promises, and the newer variants against NumPy ports of their authors' code.

The generic tests are parametrised over the registry, so a new variant file is tested by them as
soon as it is registered: plain MHA at its identity setting, no leak from the future under
causality, the same parameters and numbers (and records) in Linen and NNX, jit/vmap/grad, and
decoding (or a one-line refusal)."""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import multihead
from attention_jax import nnx as ajnnx
from attention_jax import variants
from examples import nnx_encoder  # the NNX encoder, an example on the library
from conftest import assert_close, redrawn

D_IN, HEADS, T = 16, 4, 6
NAMES = sorted(variants.REGISTRY)


def _x(seed=0, shape=(2, T, D_IN)):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _variant(name, **options):
  return variants.layer_variant(name, layer=1, num_layers=2, **options)


def _layer_and_params(name, seed=1, variant=None, **options):
  """The Linen layer (of ``variant``, default ``_variant(name)``) and its parameters redrawn at
  unit-ish scale (conftest.redrawn)."""
  layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variant or _variant(name),
                                **options)
  return layer, redrawn(layer.init(jax.random.key(seed), _x())["params"], seed + 1)


def _mask_and_bias():
  """A padding mask (the second sequence's last two keys) and ALiBi's bias."""
  return {"mask": aj.padding_mask(jnp.array([[True] * T, [True] * 4 + [False] * 2])),
          "bias": aj.alibi_bias(HEADS, T, T)}


@pytest.mark.parametrize("name", NAMES)
def test_a_variant_at_its_identity_setting_is_multi_head_attention(name):
  layer, params = _layer_and_params(name)
  identity = layer.head_variant.identity(params) if layer.head_variant else (None, params)
  if identity is None:
    pytest.skip(f"{name} has no setting at which it is plain MHA (tested against its code)")
  variant, params = identity
  call = dict(_mask_and_bias(), is_causal=True)
  x = _x()
  y = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variant).apply({"params": params}, x,
                                                                         **call)
  plain = {key: value for key, value in params.items() if key not in variants.REGISTRY}
  assert_close(y, aj.MultiHeadAttention(num_heads=HEADS).apply({"params": plain}, x, **call),
               rtol=1e-6, name=name)


@pytest.mark.parametrize("name", NAMES)
def test_a_causal_variant_leaks_nothing_from_the_future(name):
  layer, params = _layer_and_params(name)
  x = _x()
  changed = x.at[:, 3:].set(_x(seed=5)[:, 3:])
  before = layer.apply({"params": params}, x, is_causal=True)
  after = layer.apply({"params": params}, changed, is_causal=True)
  np.testing.assert_array_equal(before[:, :3], after[:, :3])
  assert np.max(np.abs(before[:, 3:] - after[:, 3:])) > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_linen_and_nnx_hold_the_same_tree_and_compute_and_record_the_same(name):
  options = {"moh": {"shared_heads": 1, "routed_heads": 2}}.get(name, {})  # not the defaults
  layer, params = _layer_and_params(name, variant=_variant(name, **options), normalize_qk=True)
  variant = layer.head_variant
  twin = ajnnx.MultiHeadAttention(HEADS, D_IN, head_variant=variant, normalize_qk=True,
                                  rngs=nnx.Rngs(0))
  ajnnx.load_linen_params(twin, params)
  assert jax.tree.structure(ajnnx.linen_params(twin)) == jax.tree.structure(params)
  x = _x()
  call = dict(_mask_and_bias(), is_causal=True, sow_weights=True)
  expected, state = layer.apply({"params": params}, x, **call, mutable=["intermediates", "losses"])
  y, intermediates, losses = nnx.capture(twin, nnx.Intermediate, ajnnx.Losses)(x, **call)
  assert_close(y, expected, rtol=1e-6)
  for linen_records, nnx_records in ((state["intermediates"], intermediates),
                                     (state.get("losses", {}), losses)):
    nnx_records = nnx.to_pure_dict(nnx_records)
    assert sorted(nnx_records) == sorted(linen_records)
    for record, value in linen_records.items():
      assert_close(nnx_records[record][0], value[0], rtol=1e-6, name=record)
  # a two-layer encoder (variants that follow the layer index differ between them)
  config = aj.EncoderConfig(vocab_size=11, d_model=D_IN, num_heads=HEADS, num_layers=2,
                            num_classes=5, max_length=T, positional_encoding="rope",
                            head_variant=name, head_variant_options=options)
  tokens = jnp.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 0, 0, 0]])
  linen = aj.TokenClassifier(config)
  variables = linen.init(jax.random.key(0), tokens)
  model = ajnnx.load_linen_params(nnx_encoder.TokenClassifier(config, rngs=nnx.Rngs(1)),
                                  variables["params"])
  assert_close(model(tokens), linen.apply(variables, tokens), rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_a_variant_runs_under_jit_vmap_and_grad(name):
  layer, params = _layer_and_params(name)
  x = _x(shape=(3, 2, T, D_IN))  # a leading axis to vmap over
  apply = lambda p, x: layer.apply({"params": p}, x, is_causal=True)
  expected = jnp.stack([apply(params, batch) for batch in x])
  assert_close(jax.jit(jax.vmap(apply, in_axes=(None, 0)))(params, x), expected, rtol=1e-5)
  grads = jax.grad(lambda p: jnp.sum(apply(p, x[0]) ** 2))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  for group in (name,) if name in params else ():  # the variant's own parameters learn
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads[group])), group


@pytest.mark.parametrize("name", NAMES)
def test_a_variant_decodes_as_it_attends_or_refuses_in_one_line(name):
  layer = ajnnx.MultiHeadAttention(HEADS, D_IN, head_variant=_variant(name), rngs=nnx.Rngs(0))
  x = _x()
  layer.init_cache(x.shape)
  if layer.head_variant.decoding:
    with pytest.raises(ValueError, match=f"head variant '{name}'") as error:
      layer(x[:, :1], decode=True)
    assert "\n" not in str(error.value)
    return
  full = layer(x, is_causal=True)
  steps = [layer(x[:, t:t + 1], decode=True) for t in range(T)]
  assert_close(jnp.concatenate(steps, axis=1), full, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_a_variant_is_usable_by_name_from_a_run_config(name):
  from configs import default
  from experiments import config_check
  config = default.get_config()
  config.model.head_variant = name
  config_check.validate(config)


def test_a_variant_in_the_user_s_own_package_works_as_the_guide_says(tmp_path, monkeypatch):
  """docs/guides/custom_variant.md, "Your own": its file written into a package of the user's,
  its usage block run as it stands, and the run config naming it by import path; nothing in
  attention_jax registers it."""
  import pathlib
  import re
  from configs import default
  from experiments import config_check
  guide = (pathlib.Path(__file__).parent.parent / "docs/guides/custom_variant.md").read_text()
  blocks = dict(re.findall(r"```\{code-block\} python\n:caption: (.*?)\n\n(.*?)```", guide, re.S))
  (tmp_path / "my_variants").mkdir()
  (tmp_path / "my_variants" / "head_scale.py").write_text(blocks["my_variants/head_scale.py"])
  monkeypatch.syspath_prepend(str(tmp_path))
  exec(compile(blocks["using it"], "custom_variant.md", "exec"), {})
  assert "head_scale" not in variants.REGISTRY
  config = default.get_config()
  config.model.head_variant = "my_variants.head_scale:HeadScale"  # --config.model.head_variant=
  config_check.validate(config)
  # its options from a config file, then changed on the command line, as the guide says
  (tmp_path / "my_config.py").write_text(
      "from configs import default\n\n\ndef get_config():\n  config = default.get_config()\n"
      "  config.model.head_variant = 'my_variants.head_scale:HeadScale'\n"
      "  config.model.head_variant_options = {'init': 0.5}\n  return config\n")
  from absl import flags
  from ml_collections import config_flags
  for argv, init in (([], 0.5), (["--config.model.head_variant_options.init=0.25"], 0.25)):
    argv = ["train", f"--config={tmp_path / 'my_config.py'}", *argv]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    config_check.validate(flag_values.config)
    assert config_check.encoder_config(flag_values.config).head_variant_of(0).init == init
  for path, words in (("my_variants.nowhere:HeadScale", "cannot be imported"),
                      ("my_variants.head_scale:jnp", "not a subclass")):
    config.model.head_variant = path
    with pytest.raises(config_check.ConfigError, match=words) as error:
      config_check.validate(config)
    assert "\n" not in str(error.value)


def test_an_unknown_variant_or_setting_is_refused_in_one_line():
  for call, words in ((lambda: variants.get("talking"), "unknown head variant 'talking'"),
                      (lambda: variants.get("gated", overlap=1), "takes no options"),
                      (lambda: aj.EncoderConfig(vocab_size=8, head_variant="differential",
                                                d_model=12, num_heads=4), "must be even"),
                      (lambda: aj.MultiHeadAttention(num_heads=1, head_variant=variants.get(
                          "dcmha")).init(jax.random.key(0), _x()), "num_heads >= 2")):
    with pytest.raises(ValueError, match=words) as error:
      call()
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------
# Gated attention: a NumPy port of qiuzh20/gated_attention's modeling_qwen3.py (Qwen3Attention
# with headwise_attn_output_gate or elementwise_attn_output_gate), no RoPE, no QK-norm, no bias.

def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _causal(logits):
  t, s = logits.shape[-2:]
  return np.where(np.tril(np.ones((t, s), bool)), logits, -np.inf)


def _repeat_kv(x, n_rep):  # [B, K, L, H] -> [B, K * n_rep, L, H], as the code's repeat_kv
  return np.repeat(x, n_rep, axis=1)


def gated_qwen3_numpy(hidden, q_proj, k_proj, v_proj, o_proj, *, num_heads, num_kv_heads,
                      head_dim, headwise):
  """The code's forward with nn.Linear weights given as [in, out] matrices."""
  bsz, q_len, _ = hidden.shape
  groups = num_heads // num_kv_heads
  query = (hidden @ q_proj).reshape(bsz, q_len, num_kv_heads, -1)
  if headwise:
    query, gate = np.split(query, [head_dim * groups], axis=-1)
    gate = gate.reshape(bsz, q_len, -1, 1)
  else:
    query, gate = np.split(query, [head_dim * groups], axis=-1)
    gate = gate.reshape(bsz, q_len, -1, head_dim)
  query = query.reshape(bsz, q_len, -1, head_dim).transpose(0, 2, 1, 3)
  key = (hidden @ k_proj).reshape(bsz, q_len, -1, head_dim).transpose(0, 2, 1, 3)
  value = (hidden @ v_proj).reshape(bsz, q_len, -1, head_dim).transpose(0, 2, 1, 3)
  key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
  weights = _softmax(_causal(query @ key.transpose(0, 1, 3, 2) / math.sqrt(head_dim)))
  out = (weights @ value).transpose(0, 2, 1, 3)  # [B, T, N, H]
  out = out * (1 / (1 + np.exp(-gate)))
  return out.reshape(bsz, q_len, -1) @ o_proj


@pytest.mark.parametrize("name, headwise", [("gated", False), ("gated_headwise", True)])
@pytest.mark.parametrize("num_kv_heads", [HEADS, 2])
def test_gated_attention_equals_a_port_of_its_code(name, headwise, num_kv_heads):
  head_dim, groups = D_IN // HEADS, HEADS // num_kv_heads
  gate_width = groups if headwise else groups * head_dim
  rng = np.random.default_rng(3)
  q_proj = rng.standard_normal((D_IN, num_kv_heads * (groups * head_dim + gate_width))) / 4
  k_proj, v_proj = (rng.standard_normal((D_IN, num_kv_heads * head_dim)) / 4 for _ in range(2))
  o_proj = rng.standard_normal((HEADS * head_dim, D_IN)) / 4
  x = np.asarray(_x(), np.float64)
  expected = gated_qwen3_numpy(x, q_proj, k_proj, v_proj, o_proj, num_heads=HEADS,
                               num_kv_heads=num_kv_heads, head_dim=head_dim, headwise=headwise)
  # the code's q_proj columns per key/value head: G query heads of H, then G gates (of 1 or H)
  per_group = q_proj.reshape(D_IN, num_kv_heads, -1)
  query = per_group[..., :groups * head_dim].reshape(D_IN, HEADS, head_dim)
  gate = per_group[..., groups * head_dim:].reshape((D_IN, HEADS) + (() if headwise
                                                                     else (head_dim,)))
  params = {"query": {"kernel": query},
            "key": {"kernel": k_proj.reshape(D_IN, num_kv_heads, head_dim)},
            "value": {"kernel": v_proj.reshape(D_IN, num_kv_heads, head_dim)},
            "out": {"kernel": o_proj.reshape(HEADS, head_dim, D_IN)}, name: {"gate": gate}}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  layer = aj.MultiHeadAttention(num_heads=HEADS, num_kv_heads=num_kv_heads, use_bias=False,
                                head_variant=variants.get(name))
  variables = layer.init(jax.random.key(0), _x())
  assert jax.tree.map(jnp.shape, variables["params"]) == jax.tree.map(jnp.shape, params)
  assert_close(layer.apply({"params": params}, _x(), is_causal=True), expected, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Differential attention: a NumPy port of microsoft/unilm's Diff-Transformer/multihead_diffattn.py
# (MultiheadDiffAttn.forward with its default causal mask and no rotary embedding).

def diff_attn_numpy(x, q_proj, k_proj, v_proj, out_proj, lambdas, subln_weight, *, depth,
                    num_heads, num_kv_heads):
  bsz, tgt_len, embed_dim = x.shape
  head_dim = embed_dim // num_heads // 2
  n_rep = num_heads // num_kv_heads
  q = (x @ q_proj).reshape(bsz, tgt_len, 2 * num_heads, head_dim).transpose(0, 2, 1, 3)
  k = (x @ k_proj).reshape(bsz, tgt_len, 2 * num_kv_heads, head_dim).transpose(0, 2, 1, 3)
  v = (x @ v_proj).reshape(bsz, tgt_len, num_kv_heads, 2 * head_dim).transpose(0, 2, 1, 3)
  k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
  q = q * head_dim ** -0.5
  weights = _softmax(_causal(q @ k.transpose(0, 1, 3, 2)))
  lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
  lq1, lk1, lq2, lk2 = lambdas
  lambda_full = np.exp(np.sum(lq1 * lk1)) - np.exp(np.sum(lq2 * lk2)) + lambda_init
  weights = weights.reshape(bsz, num_heads, 2, tgt_len, tgt_len)
  weights = weights[:, :, 0] - lambda_full * weights[:, :, 1]
  attn = weights @ v
  attn = attn / np.sqrt(np.mean(attn ** 2, axis=-1, keepdims=True) + 1e-5) * subln_weight
  attn = attn * (1 - lambda_init)
  attn = attn.transpose(0, 2, 1, 3).reshape(bsz, tgt_len, num_heads * 2 * head_dim)
  return attn @ out_proj


@pytest.mark.parametrize("num_kv_heads, depth", [(HEADS, 0), (2, 5)])
def test_differential_attention_equals_a_port_of_its_code(num_kv_heads, depth):
  rng = np.random.default_rng(4)
  kv_width = D_IN * num_kv_heads // HEADS
  q_proj = rng.standard_normal((D_IN, D_IN)) / 4
  k_proj, v_proj = (rng.standard_normal((D_IN, kv_width)) / 4 for _ in range(2))
  out_proj = rng.standard_normal((D_IN, D_IN)) / 4
  half = D_IN // HEADS // 2
  lambdas = [rng.standard_normal(half) * 0.3 for _ in range(4)]
  subln_weight = 1 + rng.standard_normal(2 * half) * 0.1
  x = _x()
  expected = diff_attn_numpy(np.asarray(x, np.float64), q_proj, k_proj, v_proj, out_proj,
                             lambdas, subln_weight, depth=depth, num_heads=HEADS,
                             num_kv_heads=num_kv_heads)
  params = {"query": {"kernel": q_proj.reshape(D_IN, HEADS, 2 * half)},
            "key": {"kernel": k_proj.reshape(D_IN, num_kv_heads, 2 * half)},
            "value": {"kernel": v_proj.reshape(D_IN, num_kv_heads, 2 * half)},
            "out": {"kernel": out_proj.reshape(HEADS, 2 * half, D_IN)},
            "differential": dict(zip(("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
                                     lambdas), scale=subln_weight)}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  variant = variants.layer_variant("differential", layer=depth, num_layers=depth + 1)
  layer = aj.MultiHeadAttention(num_heads=HEADS, num_kv_heads=num_kv_heads, use_bias=False,
                                head_variant=variant)
  shapes = jax.tree.map(jnp.shape, layer.init(jax.random.key(0), x)["params"])
  assert shapes == jax.tree.map(jnp.shape, params)
  assert_close(layer.apply({"params": params}, x, is_causal=True), expected, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Attention sinks: a NumPy port of gpt-oss's reference sdpa (gpt_oss/torch/model.py), one
# sequence at a time, grouped-query heads as [T, K, G, H]; sigmoid attention: a NumPy port of
# apple/ml-sigmoid-attention's reference (sigmoid(Q K^T / sqrt(d) + b) V, -inf where masked).

def sdpa_gpt_oss_numpy(Q, K, V, S, sm_scale):
  n_tokens, n_heads, q_mult, d_head = Q.shape
  K = np.broadcast_to(K[:, :, None, :], Q.shape)
  V = np.broadcast_to(V[:, :, None, :], Q.shape)
  S = np.broadcast_to(S.reshape(n_heads, q_mult, 1, 1), (n_heads, q_mult, n_tokens, 1))
  mask = np.triu(np.full((n_tokens, n_tokens), -np.inf), k=1)
  QK = np.einsum("qhmd,khmd->hmqk", Q, K) * sm_scale + mask[None, None]
  W = _softmax(np.concatenate([QK, S], axis=-1))[..., :-1]
  return np.einsum("hmqk,khmd->qhmd", W, V).reshape(n_tokens, -1)


def sigmoid_attn_numpy(q, k, v, sigmoid_bias):  # [B, N, T, H]
  logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]) + sigmoid_bias
  logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
  return (1.0 / (1.0 + np.exp(-logits))) @ v


@pytest.mark.parametrize("name", ["sinks", "sigmoid"])
@pytest.mark.parametrize("num_kv_heads", [HEADS, 2])
def test_sinks_and_sigmoid_attention_equal_ports_of_their_code(name, num_kv_heads):
  head_dim, groups = D_IN // HEADS, HEADS // num_kv_heads
  rng = np.random.default_rng(5)
  q_proj = rng.standard_normal((D_IN, HEADS * head_dim)) / 2
  k_proj, v_proj = (rng.standard_normal((D_IN, num_kv_heads * head_dim)) / 2 for _ in range(2))
  o_proj = rng.standard_normal((HEADS * head_dim, D_IN)) / 4
  sinks = rng.standard_normal(HEADS) * 2
  x = np.asarray(_x(), np.float64)
  q, k, v = x @ q_proj, x @ k_proj, x @ v_proj
  if name == "sinks":
    heads = np.stack([sdpa_gpt_oss_numpy(
        q[b].reshape(T, num_kv_heads, groups, head_dim), k[b].reshape(T, num_kv_heads, head_dim),
        v[b].reshape(T, num_kv_heads, head_dim), sinks, head_dim ** -0.5) for b in range(2)])
  else:
    split = lambda a, n: np.repeat(a.reshape(2, T, n, head_dim).transpose(0, 2, 1, 3),
                                   HEADS // n, axis=1)
    heads = sigmoid_attn_numpy(split(q, HEADS), split(k, num_kv_heads), split(v, num_kv_heads),
                               -math.log(T)).transpose(0, 2, 1, 3).reshape(2, T, -1)
  params = {"query": {"kernel": q_proj.reshape(D_IN, HEADS, head_dim)},
            "key": {"kernel": k_proj.reshape(D_IN, num_kv_heads, head_dim)},
            "value": {"kernel": v_proj.reshape(D_IN, num_kv_heads, head_dim)},
            "out": {"kernel": o_proj.reshape(HEADS, head_dim, D_IN)},
            **({"sinks": {"sinks": sinks}} if name == "sinks" else {})}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  layer = aj.MultiHeadAttention(num_heads=HEADS, num_kv_heads=num_kv_heads, use_bias=False,
                                head_variant=variants.get(name))
  shapes = jax.tree.map(jnp.shape, layer.init(jax.random.key(0), _x())["params"])
  assert shapes == jax.tree.map(jnp.shape, params)
  for implementation in ("reference", "chunked"):  # the dense formula and the blockwise kernel
    y, state = layer.clone(implementation=implementation).apply(
        {"params": params}, _x(), is_causal=True, sow_weights=True, mutable="intermediates")
    assert_close(y, heads @ o_proj, rtol=1e-5, name=implementation)
  # the recorded maps are the weights applied: rows short of 1 by the sink's share, or sigmoids
  weights = state["intermediates"]["attention_weights"][0]
  assert float(jnp.max(jnp.sum(weights, axis=-1))) < 1.0 if name == "sinks" else 1.0 < float(
      jnp.max(jnp.sum(weights, axis=-1)))


def test_a_variant_s_attention_arguments_are_not_passed_twice():
  layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=variants.get("sinks"))
  params = layer.init(jax.random.key(0), _x())
  with pytest.raises(ValueError, match="head variant 'sinks' sets sinks itself") as error:
    layer.apply(params, _x(), sinks=jnp.zeros(HEADS))
  assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------
# The seed's four, where they now follow their code.

def test_nnx_records_moh_load_balancing_without_the_maps_as_linen_does():
  """The NNX shell records the auxiliary loss as ajnnx.Losses whatever sow_weights says (it was
  recorded only beside the attention maps), the same numbers as Linen's "losses" collection."""
  config = aj.EncoderConfig(vocab_size=11, d_model=D_IN, num_heads=HEADS, num_layers=2,
                            num_classes=5, max_length=T, head_variant="moh")
  tokens = jnp.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 1, 2, 3]])
  linen = aj.TokenClassifier(config)
  params = linen.init(jax.random.key(0), tokens)["params"]
  _, sown = linen.apply({"params": params}, tokens, mutable=variants.LOSSES)
  model = ajnnx.load_linen_params(nnx_encoder.TokenClassifier(config, rngs=nnx.Rngs(1)), params)
  _, losses = nnx.capture(model, ajnnx.Losses)(tokens)
  assert_close(variants.auxiliary_loss({"losses": nnx.to_pure_dict(losses)}),
               variants.auxiliary_loss(sown), rtol=1e-6)
  layer = ajnnx.MultiHeadAttention(HEADS, D_IN, head_variant=variants.get("moh"),
                                   rngs=nnx.Rngs(0))
  _, losses = nnx.capture(layer, ajnnx.Losses)(_x(), sow_weights=False)
  assert float(losses["load_balancing"][0]) >= 0.0099  # 0.01 x a loss of at least k = 1


def _count(primitive, fn, *args):
  jaxpr = jax.make_jaxpr(fn)(*args)
  text = str(jaxpr)
  return text.count(f" {primitive}[") + text.count(f" {primitive} ")


@pytest.mark.parametrize("name, primitive", [("moh", "top_k"), ("dcmha", "tanh")])
def test_recording_the_maps_computes_a_variant_s_state_once(name, primitive):
  layer, params = _layer_and_params(name)
  x = _x()
  run = lambda sow: lambda p: layer.apply({"params": p}, x, sow_weights=sow,
                                          mutable=["intermediates", "losses"])
  assert _count(primitive, run(True), params) == _count(primitive, run(False), params) > 0


def test_talking_heads_dropout_shares_one_mask_over_the_queries():
  """mesh-tensorflow drops the length axis from the mask's shape: every query of a head sees
  the same keys dropped."""
  variant = variants.get("talking_heads")
  length = 8
  query = key = jnp.zeros((1, length, HEADS, 2))
  value = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (1, length, HEADS, length))
  eye = jnp.eye(HEADS)
  for broadcast in (False, True):  # mesh-tensorflow's mask [B, N, 1, S] either way
    heads = aj.dot_product_attention(
        query, key, value, hooks=variant.hooks({"logits_mix": eye, "weights_mix": eye}),
        scale=1.0, dropout_rate=0.5, dropout_rng=jax.random.key(0),
        broadcast_dropout=broadcast)
    kept = np.asarray(heads[0] != 0)  # [T, N, S]: the weight of key s at query t, head n
    assert np.all(kept == kept[:1]) and not np.all(kept == kept[:, :1])  # per head, not query
    assert 0 < kept.mean() < 1


def test_dcmha_rank_and_moh_without_routed_heads_follow_their_code():
  specs = variants.get("dcmha").params(in_features=D_IN, num_heads=3, head_dim=4)
  assert specs["qkw"][0] == (4, 12, 2 * 3, 3)  # rank N // (N // 2) = 3 at three heads
  moh = variants.get("moh", shared_heads=HEADS, routed_heads=0)  # MoH-ViT's routed_head=0
  layer, params = _layer_and_params("moh")
  layer = aj.MultiHeadAttention(num_heads=HEADS, head_variant=moh)
  variables = layer.init(jax.random.key(0), _x())
  assert set(variables["params"]["moh"]) == {"shared_router"}
  _, state = layer.apply(variables, _x(), mutable=["intermediates", "losses"])
  gates = state["intermediates"]["head_gates"][0]  # softmax(x W_s) * N, no loss
  assert_close(jnp.sum(gates, axis=-1), jnp.full(gates.shape[:-1], HEADS), rtol=1e-6)
  assert "losses" not in state


def test_the_mixes_and_routers_are_drawn_as_their_code_draws_them():
  n = 64
  mix = variants.get("talking_heads").params(in_features=8, num_heads=n, head_dim=2)
  (shape, init) = mix["logits_mix"]
  values = np.asarray(init(jax.random.key(0), shape))
  # tf.truncated_normal_initializer(stddev=1/sqrt(N)): cut at 2 stddev, not rescaled after
  assert np.max(np.abs(values)) <= 2 / math.sqrt(n)
  np.testing.assert_allclose(values.std(), 0.8796 / math.sqrt(n), rtol=0.05)
  (shape, init) = variants.get("moh").params(in_features=256, num_heads=16,
                                             head_dim=2)["router"]
  np.testing.assert_allclose(np.asarray(init(jax.random.key(0), shape)).std(), 0.02, rtol=0.05)


@pytest.mark.parametrize("name", [n for n in NAMES if variants.REGISTRY[n].forms_maps])
def test_a_variant_forming_its_maps_validates_as_dot_product_attention(name):
  layer, params = _layer_and_params(name)
  x = _x()
  for options, words in (({"logits_soft_cap": -1.0}, "logits_soft_cap"),
                         ({"query_segment_ids": jnp.zeros((2, T), jnp.int32)}, "both"),
                         ({"key_value_seq_lengths": jnp.ones((3,), jnp.int32)},
                          "key_value_seq_lengths"),
                         ({"mask": jnp.ones((2, 3, T, T), bool)}, "mask")):
    with pytest.raises(ValueError, match=words) as error:
      layer.apply({"params": params}, x, **options)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["sinks", "sigmoid"])
def test_a_run_config_refuses_a_kernel_argument_variant_under_context_parallelism(name):
  from configs import default
  from experiments import config_check
  config = default.get_config()
  config.model.head_variant, config.mesh.sequence = name, 2
  with pytest.raises(config_check.ConfigError, match="context-parallel attention does not serve"):
    config_check.validate(config)


def test_sigmoid_attention_with_a_fixed_bias_decodes_as_it_attends():
  layer = ajnnx.MultiHeadAttention(HEADS, D_IN, head_variant=variants.get("sigmoid", bias=-2.0),
                                   rngs=nnx.Rngs(0))
  x = _x()
  layer.init_cache(x.shape)
  full = layer(x, is_causal=True)
  steps = [layer(x[:, t:t + 1], decode=True) for t in range(T)]
  assert_close(jnp.concatenate(steps, axis=1), full, rtol=1e-5)


def test_forms_maps_follows_from_the_hooks_a_variant_overrides():
  """No flag to forget: overriding logits or weights makes a variant form its maps."""

  class Mixed(variants.Variant):
    name = "mixed"

    def weights(self, state, weights):
      return weights * 2.0

  class Gated(variants.Variant):
    name = "gated_here"

    def heads(self, state, heads):
      return heads

  assert Mixed.forms_maps and not Gated.forms_maps and not variants.Variant.forms_maps
  assert Mixed().hooks(None).weights(jnp.ones(2)).tolist() == [2.0, 2.0]
  assert Gated().hooks(None) is None
  assert {name for name in NAMES if variants.REGISTRY[name].forms_maps} == {
      "talking_heads", "dcmha", "differential", "qk_norm_learned"}


@pytest.mark.parametrize("name", ["talking_heads", "dcmha", "differential", "moh"])
def test_attention_maps_are_the_maps_the_layer_applies(name):
  """attention_maps runs the step: the weights hook is applied there as in the layer."""
  layer, params = _layer_and_params(name)
  x = _x()
  mask = jnp.arange(T)[None, None, None, :] < jnp.array([T, T - 2])[:, None, None, None]
  _, state = layer.apply({"params": params}, x, mask=mask, sow_weights=True,
                         mutable="intermediates")
  logits, weights = multihead.attention_maps(params, x, mask=mask, head_variant=_variant(name))
  sown = state["intermediates"]
  assert_close(weights, sown["attention_weights"][0], rtol=1e-6)
  assert_close(logits, sown["attention_logits"][0], rtol=1e-6)
  assert float(jnp.max(jnp.abs(weights[1, ..., T - 2:]))) == 0.0  # masked again after the hook
