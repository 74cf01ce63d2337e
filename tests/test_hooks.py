"""Hook points: captured values and patched outputs against a hand-written float64 forward pass of
the same layer (grouped-query, blockwise and fused kernels), the same names in Linen, NNX and the
encoder, nothing added when no hook is asked for, and jit, vmap, grad and scan over layers."""

import contextlib
import functools
import json
import pathlib
import re
import sys
import types

from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_jax import hooks
from attention_jax import nnx as ajnnx
from attention_jax import pallas_gpu
from examples import nnx_encoder

B, T, D, N, K = 2, 6, 16, 4, 2  # batch, tokens, width, query heads, key/value heads
H = D // N


def _layer_and_inputs(dtype=jnp.float64, **options):
  layer = aj.MultiHeadAttention(num_heads=N, num_kv_heads=K, param_dtype=dtype, **options)
  x = jax.random.normal(jax.random.key(1), (B, T, D), dtype)
  other = jax.random.normal(jax.random.key(2), (B, T, D), dtype)
  return layer, layer.init(jax.random.key(0), x), x, other


def _by_hand(params, x, *, causal=False, z_patch=None, k_patch=None, pattern_patch=None):
  """The layer's forward pass in numpy float64, written from the formulas, with patches applied
  where the hooks apply them: {hook: value}."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  proj = lambda name: np.einsum("btd,dnh->btnh", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")  # [B, T, N|K, H]
  k = k if k_patch is None else k_patch(k)
  group = N // K
  k_n, v_n = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # head n reads n // G
  scores = np.einsum("btnh,bsnh->bnts", q, k_n) / np.sqrt(H)
  masked = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf) if causal else scores
  pattern = np.exp(masked - masked.max(-1, keepdims=True))
  pattern /= pattern.sum(-1, keepdims=True)
  pattern = pattern if pattern_patch is None else pattern_patch(pattern)
  z = np.einsum("bnts,bsnh->btnh", pattern, v_n)
  z = z if z_patch is None else z_patch(z)
  result = np.einsum("btnh,nhd->btnd", z, p["out"]["kernel"])
  values = {"attn.hook_q": q, "attn.hook_k": k, "attn.hook_v": v, "attn.hook_attn_scores": scores,
            "attn.hook_pattern": pattern, "attn.hook_z": z, "attn.hook_result": result}
  return result.sum(2) + p["out"]["bias"], values


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_captured_values_and_patched_outputs_are_the_hand_written_forward_pass(implementation):
  with jax.enable_x64():
    layer, variables, x, other = _layer_and_inputs(implementation=implementation)
    output, values = hooks.capture(layer, variables, x, list(_by_hand(variables["params"], x)[1]),
                                   is_causal=True)
    expected, by_hand = _by_hand(variables["params"], x, causal=True)
    np.testing.assert_allclose(output, expected, atol=1e-6)
    for name, value in by_hand.items():
      if name == "attn.hook_attn_scores":  # before the mask: compare where it attends
        value, values[name] = np.tril(value), np.tril(values[name])
      np.testing.assert_allclose(values[name], value, atol=1e-6, err_msg=name)
    # z of head 1 at position 3 from the other input; key/value head 0 zeroed (query heads 0, 1)
    _, other_values = _by_hand(variables["params"], other, causal=True)
    z_other = other_values["attn.hook_z"]

    def z_patch(z):
      z = z.copy()
      z[:, 3, 1] = z_other[:, 3, 1]
      return z

    def k_patch(k):
      k = k.copy()
      k[:, :, 0] = 0.0
      return k

    patched = hooks.patch(layer, variables, x, {
        "attn.hook_z": hooks.set_to(jnp.asarray(z_other), heads=1, positions=3),
        "attn.hook_k": hooks.zero(heads=0)}, is_causal=True)
    expected, _ = _by_hand(variables["params"], x, causal=True, z_patch=z_patch, k_patch=k_patch)
    np.testing.assert_allclose(patched, expected, atol=1e-6)


def test_patched_pattern_and_maps_from_the_kernels_log_sum_exp_are_exact():
  with jax.enable_x64():
    layer, variables, x, _ = _layer_and_inputs(implementation="chunked")
    uniform = lambda w: np.where(w > 0, 1.0, 0.0) / np.sum(w > 0, axis=-1, keepdims=True)
    patched = hooks.patch(layer, variables, x, {"attn.hook_pattern": hooks.Patch(
        lambda w: jnp.asarray(uniform(np.asarray(w))), heads=2)}, is_causal=True)

    def pattern_patch(w):
      w = w.copy()
      w[:, 2] = uniform(w[:, 2])
      return w

    expected, by_hand = _by_hand(variables["params"], x, causal=True, pattern_patch=pattern_patch)
    np.testing.assert_allclose(patched, expected, atol=1e-6)
    rows = jnp.array([0, 4])
    _, values = hooks.capture(layer, variables, x, ["attn.hook_pattern"], query_rows=rows,
                              is_causal=True)
    _, by_hand = _by_hand(variables["params"], x, causal=True)
    np.testing.assert_allclose(values["attn.hook_pattern"],
                               by_hand["attn.hook_pattern"][:, :, rows], atol=1e-6)


def test_the_fused_kernel_serves_z_patches_and_maps_rows_in_the_interpreter():
  def fused(query, key, value, *, scale, is_causal=False, return_residual=False):
    causal = (lambda b, h, q_idx, kv_idx: q_idx >= kv_idx) if is_causal else None
    out, lse = pallas_gpu.flex_attention(query, key, value, scale=scale, mask_mod=causal,
                                         block_size=16, interpret=True)
    return (out, lse) if return_residual else out

  layer, variables, x, _ = _layer_and_inputs(jnp.float32, attention_fn=fused)
  dense = layer.clone(attention_fn=None, implementation="reference")
  ablate = {"attn.hook_z": hooks.zero(heads=(0, 3))}
  np.testing.assert_allclose(hooks.patch(layer, variables, x, ablate, is_causal=True),
                             hooks.patch(dense, variables, x, ablate, is_causal=True), atol=1e-5)
  rows = jnp.array([5])
  _, fused_rows = hooks.capture(layer, variables, x, ["attn.hook_pattern"], query_rows=rows,
                                is_causal=True)
  _, every_row = hooks.capture(dense, variables, x, ["attn.hook_pattern"], is_causal=True)
  np.testing.assert_allclose(fused_rows["attn.hook_pattern"],
                             every_row["attn.hook_pattern"][:, :, rows], atol=1e-5)


CONFIG = aj.EncoderConfig(vocab_size=16, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          dropout_rate=0.0)
TOKENS = jax.random.randint(jax.random.key(3), (3, 5), 1, 16)
NAMES = [f"blocks.{layer}.{name}" for layer in range(2) for name in (
    "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores",
    "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out", "hook_resid_mid",
    "hook_mlp_out", "hook_resid_post")]


def test_linen_and_nnx_encoders_have_the_same_hook_points_and_values():
  model = aj.TransformerEncoder(CONFIG)
  variables = model.init(jax.random.key(0), TOKENS)
  twin = ajnnx.load_linen_params(nnx_encoder.TransformerEncoder(CONFIG, rngs=nnx.Rngs(1)),
                                 variables)
  linen_out, linen_values = hooks.capture(model, variables, TOKENS, NAMES)
  nnx_out, nnx_values = hooks.capture(twin, None, TOKENS, NAMES)
  np.testing.assert_allclose(nnx_out, linen_out, atol=1e-5)
  for name in NAMES:
    np.testing.assert_allclose(nnx_values[name], linen_values[name], atol=1e-5, err_msg=name)
  ablate = {"blocks.1.attn.hook_v": hooks.zero(heads=0, positions=(1, 2)),
            "blocks.0.hook_mlp_out": lambda out: 2.0 * out}
  np.testing.assert_allclose(hooks.patch(twin, nnx.state(twin), TOKENS, ablate),
                             hooks.patch(model, variables, TOKENS, ablate), atol=1e-5)
  # the stream adds up: pre-LN off, so resid_mid = LN(resid_pre + attn_out), and the heads'
  # contributions sum to the attention's output (less b_O)
  bias = variables["params"]["block_0"]["attention"]["out"]["bias"]
  np.testing.assert_allclose(linen_values["blocks.0.attn.hook_result"].sum(-2) + bias,
                             linen_values["blocks.0.hook_attn_out"], atol=1e-5)
  np.testing.assert_allclose(linen_values["blocks.1.hook_resid_pre"],
                             linen_values["blocks.0.hook_resid_post"])


def test_no_hook_asked_for_adds_nothing_to_the_jaxpr_and_a_wrong_name_is_refused():
  model = aj.TransformerEncoder(CONFIG)
  variables = model.init(jax.random.key(0), TOKENS)
  jaxpr = lambda f: str(jax.make_jaxpr(f)(variables))
  plain = jaxpr(lambda v: model.apply(v, TOKENS))
  assert jaxpr(lambda v: hooks.capture(model, v, TOKENS, [])[0]) == plain
  assert jaxpr(lambda v: hooks.capture(model, v, TOKENS, ["blocks.0.attn.hook_result"])[0]) != plain
  with pytest.raises(ValueError, match="blocks.0.attn.hook_zz"):
    hooks.patch(model, variables, TOKENS, {"blocks.0.attn.hook_zz": hooks.zero()})
  layer, layer_variables, x, _ = _layer_and_inputs(jnp.float32)
  with pytest.raises(ValueError, match="local_window_size"):
    hooks.capture(layer, layer_variables, x, ["attn.hook_pattern"], query_rows=jnp.array([1]),
                  local_window_size=2)
  with pytest.raises(ValueError, match="no head axis"):
    hooks.patch(model, variables, TOKENS, {"blocks.0.hook_resid_pre": hooks.zero(heads=1)})


def test_a_flax_without_the_private_module_stack_is_named_in_one_line(monkeypatch):
  model = aj.TransformerEncoder(CONFIG)
  variables = model.init(jax.random.key(0), TOKENS)
  # flax as a release that moved the name would look to hooks (flax's own code keeps its globals)
  monkeypatch.setitem(sys.modules, "flax.linen.module", types.ModuleType("flax.linen.module"))
  with pytest.raises(ImportError, match=hooks.MODULE_STACK_CHECKED) as error:
    hooks.capture(model, variables, TOKENS, ["blocks.0.attn.hook_z"])
  assert "\n" not in str(error.value)


def test_vmap_over_heads_and_seed_replicas_under_jit():
  model = aj.TransformerEncoder(CONFIG)
  variables = model.init(jax.random.key(0), TOKENS)
  ablate = jax.jit(lambda head: hooks.patch(model, variables, TOKENS,
                                            {"blocks.0.attn.hook_z": hooks.zero(heads=head)}))
  every_head = jax.jit(jax.vmap(ablate))(jnp.arange(4))
  for head in (0, 3):
    np.testing.assert_allclose(every_head[head], ablate(head), atol=1e-5)
  assert not np.allclose(every_head[0], every_head[3], atol=1e-3)
  seeds = jax.vmap(lambda key: model.init(key, TOKENS))(jax.random.split(jax.random.key(5), 2))
  name = "blocks.1.attn.hook_z"
  captured = jax.jit(lambda v: hooks.capture(model, v, TOKENS, [name])[1][name])
  np.testing.assert_allclose(jax.vmap(captured)(seeds)[1],
                             captured(jax.tree.map(lambda a: a[1], seeds)), atol=1e-5)


def test_attribution_is_the_gradient_at_the_hook():
  model = aj.TransformerEncoder(CONFIG)
  variables = model.init(jax.random.key(0), TOKENS)
  metric = lambda out: jnp.sum(out[:, 0, :3])
  name = "blocks.0.attn.hook_z"
  clean, gradient = jax.jit(lambda v: hooks.attribution(model, v, TOKENS, [name], metric)[name])(
      variables)
  direction = jax.random.normal(jax.random.key(7), clean.shape)
  moved = jax.jit(jax.vmap(lambda s: metric(hooks.patch(model, variables, TOKENS,
                                                          {name: hooks.add(s * direction)}))))
  step = 1e-2
  up, down = moved(jnp.array([step, -step]))
  np.testing.assert_allclose((up - down) / (2 * step), jnp.sum(gradient * direction), rtol=1e-2)


class _Scanned(nn.Module):
  """Two attention layers under nn.scan (lax.scan), the same body for each; ``by_index``: the
  body's hook points are layer ``index``'s (hooks.layer)."""
  by_index: bool = False

  @nn.compact
  def __call__(self, x):
    def body(module, carry, index):
      with hooks.layer(index) if self.by_index else contextlib.nullcontext():
        return carry + aj.MultiHeadAttention(num_heads=N, param_dtype=x.dtype)(carry), None
    scan = nn.scan(body, variable_axes={"params": 0, hooks.COLLECTION: 0},
                   split_rngs={"params": True}, length=2)
    return scan(self, x, jnp.arange(2))[0]


def test_a_patch_applies_at_every_layer_of_a_scan_and_captures_come_stacked():
  model = _Scanned()
  _, _, x, _ = _layer_and_inputs(jnp.float32)
  variables = model.init(jax.random.key(0), x)
  ablate = {"attn.hook_z": hooks.zero(heads=1)}
  scanned = hooks.patch(model, variables, x, ablate)
  layer = aj.MultiHeadAttention(num_heads=N)
  y, values = x, []
  for index in range(2):
    params = jax.tree.map(lambda a: a[index], variables["params"])
    params = params[next(iter(params))]  # the layer's own parameters
    out, value = hooks.capture(layer, {"params": params}, y, ["attn.hook_q"], patches=ablate)
    y, values = y + out, values + [value["attn.hook_q"]]
  np.testing.assert_allclose(scanned, y, atol=1e-5)
  _, stacked = hooks.capture(model, variables, x, ["attn.hook_q"], patches=ablate)
  np.testing.assert_allclose(stacked["attn.hook_q"], np.stack(values), atol=1e-5)  # [L, ...]
  assert not np.allclose(scanned, model.apply(variables, x), atol=1e-3)


class _Unrolled(nn.Module):
  """_Scanned's layers one after the other, each in its scope blocks.{l}."""

  @nn.compact
  def __call__(self, x):
    for index in range(2):
      with hooks.scope(f"blocks.{index}"):
        x = x + aj.MultiHeadAttention(num_heads=N, param_dtype=x.dtype, name=f"layer_{index}")(x)
    return x


def test_a_linen_scan_s_hooks_by_layer_index_are_the_unrolled_model_s():
  with jax.enable_x64():
    _, _, x, _ = _layer_and_inputs()
    model = _Scanned(by_index=True)
    variables = model.init(jax.random.key(0, impl="rbg"), x)
    stacked = next(iter(variables["params"].values()))
    unrolled = {"params": {f"layer_{i}": jax.tree.map(lambda a: a[i], stacked) for i in range(2)}}
    names = ["blocks.0.attn.hook_q", "blocks.1.attn.hook_z", "blocks.1.attn.hook_pattern"]
    ablate = {"blocks.1.attn.hook_z": hooks.zero(heads=1), "blocks.0.attn.hook_v": lambda v: 2 * v}
    out, values = hooks.capture(model, variables, x, names, patches=ablate)
    expected, expected_values = hooks.capture(_Unrolled(), unrolled, x, names, patches=ablate)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    for name in names:
      np.testing.assert_allclose(values[name], expected_values[name], atol=1e-6, err_msg=name)
    only_1 = hooks.patch(model, variables, x, {"blocks.1.attn.hook_z": hooks.zero(heads=1)})
    np.testing.assert_allclose(only_1, hooks.patch(_Unrolled(), unrolled, x, {
        "blocks.1.attn.hook_z": hooks.zero(heads=1)}), atol=1e-6)
    assert not np.allclose(only_1, hooks.patch(_Unrolled(), unrolled, x, {  # not at layer 0 too
        f"blocks.{i}.attn.hook_z": hooks.zero(heads=1) for i in range(2)}), atol=1e-3)


class _ScannedEncoder(nnx.Module):
  """The NNX encoder's blocks stacked and run by nnx.scan, each call in hooks.layer(index)."""

  def __init__(self, encoder, blocks):
    self.encoder, self.blocks = encoder, blocks

  def __call__(self, tokens):
    x, mask, bias = self.encoder.embed_inputs(tokens)
    x = x.astype(self.blocks.norm_0.scale.dtype)  # a scan's carry keeps its dtype (float64 here)

    @nnx.scan(in_axes=(0, nnx.Carry, 0, None, None), out_axes=nnx.Carry)
    def run(block, x, index, mask, bias):
      with hooks.layer(index, block):
        return block(x, mask, bias)

    return run(self.blocks, x, jnp.arange(CONFIG.num_layers), mask, bias)


def test_an_nnx_scan_s_hooks_by_layer_index_are_the_unrolled_encoder_s():
  with jax.enable_x64():
    encoder = nnx_encoder.TransformerEncoder(CONFIG, rngs=nnx.Rngs(jax.random.key(1, impl="rbg")))
    params = nnx.state(encoder, nnx.Param)
    nnx.update(encoder, jax.tree.map(lambda a: a.astype(jnp.float64), params))
    graphdef, _ = nnx.split(encoder.block_0)  # the blocks' weights stacked: [L, ...]
    blocks = nnx.merge(graphdef, jax.tree.map(lambda *layers: jnp.stack(layers), *[
        nnx.state(getattr(encoder, f"block_{i}")) for i in range(CONFIG.num_layers)]))
    scanned = _ScannedEncoder(encoder, blocks)
    ablate = {"blocks.1.attn.hook_z": hooks.zero(heads=2), "blocks.0.hook_mlp_out": lambda y: -y}
    out, values = hooks.capture(scanned, None, TOKENS, NAMES, patches=ablate)
    expected, expected_values = hooks.capture(encoder, None, TOKENS, NAMES, patches=ablate)
    assert out.dtype == jnp.float64 and not np.allclose(out, encoder(TOKENS), atol=1e-3)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    for name in NAMES:
      np.testing.assert_allclose(values[name], expected_values[name], atol=1e-6, err_msg=name)
    every_head = jax.vmap(lambda head, state: hooks.patch(scanned, state, TOKENS, {
        "blocks.1.attn.hook_z": hooks.zero(heads=head)}), in_axes=(0, None))(
        jnp.array([0, 3]), nnx.state(scanned))  # the state an argument, as under jit
    np.testing.assert_allclose(every_head[1], hooks.patch(encoder, None, TOKENS, {
        "blocks.1.attn.hook_z": hooks.zero(heads=3)}), atol=1e-6)
    with pytest.raises(ValueError, match="hooks.layer"):  # an NNX scan names its module
      hooks.capture(lambda x: jax.lax.scan(lambda c, i: _in_layer(c, i), x, jnp.arange(2))[0],
                    None, jnp.ones(3), ["blocks.0.hook_resid_pre"])


def _in_layer(carry, index):
  with hooks.layer(index):
    return hooks.point("hook_resid_pre", carry), None


def test_the_patching_benchmark_s_four_ways_give_the_same_effects():
  from conftest import load_script
  benchmark = load_script("benchmark_patching")
  config = aj.EncoderConfig(vocab_size=16, d_model=8, num_heads=2, num_layers=2, mlp_dim=8,
                            dropout_rate=0.0)
  model = aj.TransformerEncoder(config)
  tokens = TOKENS[:2, :3]
  variables = model.init(jax.random.key(0), tokens)
  effects = [run() for run in benchmark.runners(model, variables, tokens, 2, 2).values()]
  for effect in effects[1:]:
    np.testing.assert_allclose(effect, effects[0], atol=1e-6)
  assert effects[0].shape == (4,) and np.all(effects[0] > 0)


def test_the_patching_guide_s_table_is_its_benchmark_file_s():
  guide = pathlib.Path(__file__).parent.parent / "docs" / "guides" / "patching.md"
  measured = json.loads(guide.with_name("patching_benchmark.json").read_text())
  rows = re.findall(r"^\| (by layer|vmapped|a Python loop of \d+ (jitted|eager))\b[^|]*\| "
                    r"(\d+) \| ([\d.]+) \|$", guide.read_text(), re.M)
  ways = {"by layer": "by layer", "vmapped": "vmapped", "jitted": "loop, jit",
          "eager": "loop, eager"}
  assert len(rows) == 4
  for first, loop, ms, ratio in rows:
    way = ways[loop or first]
    assert int(ms) == round(measured["ms"][way]), way
    assert float(ratio) == round(measured["over by layer"][way], 1), way
  assert measured["machine"]["commit"].split("+")[0] in guide.read_text()


@pytest.mark.parametrize("name", ["qk_norm_learned", "talking_heads", "dcmha", "differential"])
def test_a_variant_that_forms_its_own_maps_is_captured_as_it_applies_them(name):
  """hook_attn_scores and hook_pattern of a variant with its own logits or weights (a learned
  gain, mixed heads, a difference of maps) are the maps it applies, as attention_maps gives them
  (the capture once formed the plain maps beside the call, without the variant's hooks)."""
  layer = aj.MultiHeadAttention(num_heads=N, head_variant=name)
  x = jax.random.normal(jax.random.key(1), (B, T, D))
  variables = layer.init(jax.random.key(0), x)
  logits, weights = aj.multihead.attention_maps(
      variables["params"], x, head_variant=aj.variants.get(name))
  _, captured = hooks.capture(layer, variables, x, ["attn.hook_attn_scores", "attn.hook_pattern"])
  np.testing.assert_allclose(captured["attn.hook_attn_scores"], logits, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(captured["attn.hook_pattern"], weights, rtol=1e-6, atol=1e-6)
