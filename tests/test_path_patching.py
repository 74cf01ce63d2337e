"""experiments.path_patching: a head's path to the read-out against a hand computation, the
farthest_point oracle's one head, and the prediction's per-arm test."""

import jax
import numpy as np

import attention_jax as aj
from attention_jax import hooks
from configs.ablations import heads_binding
from experiments import oracles, path_patching, sweep
from training_helpers import oracle_run


def _layer_norm(x, params, epsilon=1e-6):  # flax.linen.LayerNorm's default epsilon
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt(np.mean(centred ** 2, -1, keepdims=True) + epsilon) * params[
      "scale"] + params["bias"]


def test_a_path_patch_moves_the_read_out_by_the_head_s_result_along_the_stream_alone():
  """Two layers: a layer-1 head's path is the one-layer case (LN_0, LN_1 with the clean
  feed-forward output, the read-out); a layer-0 head's goes on through layer 1's LayerNorms with
  layer 1's attention and feed-forward outputs clean."""
  layers = 2
  with jax.enable_x64():
    model = aj.TokenClassifier(aj.EncoderConfig(
        vocab_size=1, input_features=3, d_model=8, num_heads=2, num_layers=layers, mlp_dim=8,
        num_classes=3, dropout_rate=0.0))
    x, donor = (jax.random.normal(jax.random.key(k), (2, 5, 3), np.float64) for k in (1, 2))
    variables = jax.jit(model.init)(jax.random.key(0), x)
    names = [f"blocks.{l}.{name}" for l in range(layers) for name in (
        "hook_resid_pre", "hook_attn_out", "attn.hook_result", "hook_mlp_out")]

    @jax.jit
    def run(variables, x, donor):
      patched = [path_patching.path_patched(model, variables, x, donor, l) for l in range(layers)]
      values = [hooks.capture(model, variables, inputs, names)[1] for inputs in (x, donor)]
      return patched[0][0], [p[2] for p in patched], *values

    clean_output, patched, clean, donor_values = run(variables, x, donor)
    clean, donor_values, patched, clean_output = jax.tree.map(
        np.asarray, (clean, donor_values, patched, clean_output))
  assert patched[0].dtype == np.float64
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  blocks = [p["encoder"][f"block_{l}"] for l in range(layers)]
  for layer in range(layers):
    result = f"blocks.{layer}.attn.hook_result"
    for head in range(2):
      # the head's result difference enters the stream before its block's LN_0; every sublayer
      # after it adds its clean output; the LayerNorms on the stream, then the read-out
      stream = (clean[f"blocks.{layer}.hook_resid_pre"] + clean[f"blocks.{layer}.hook_attn_out"]
                + donor_values[result][:, :, head] - clean[result][:, :, head])
      stream = _layer_norm(stream, blocks[layer]["norm_0"])
      stream = _layer_norm(stream + clean[f"blocks.{layer}.hook_mlp_out"],
                           blocks[layer]["norm_1"])
      for later in range(layer + 1, layers):
        stream = _layer_norm(stream + clean[f"blocks.{later}.hook_attn_out"],
                             blocks[later]["norm_0"])
        stream = _layer_norm(stream + clean[f"blocks.{later}.hook_mlp_out"],
                             blocks[later]["norm_1"])
      expected = stream @ p["logits"]["kernel"] + p["logits"]["bias"]
      np.testing.assert_allclose(patched[layer][head], expected, atol=1e-6)
      assert not np.allclose(patched[layer][head], clean_output, atol=1e-3)  # it moved


def test_the_oracle_s_one_head_carries_the_whole_read_out_and_the_others_none(data_dir):
  config = sweep.variant_config(heads_binding.get_config("farthest_point_quick"),
                                dict(heads_binding.get_config("farthest_point_quick").variants)[
                                    "split_4"])
  config.data_dir = data_dir
  config.task_options.update(length=6, dimension=3, num_train=1, num_test=64)
  run, _ = oracle_run(config, oracles.farthest_point)
  numbers = path_patching.seed_numbers(run, 64)
  assert numbers["found"].shape == (1, 4) and numbers["found"][0, 0] > 0.99
  np.testing.assert_allclose(numbers["share"][0], [1.0, 0.0, 0.0, 0.0], atol=0.02)
  row = path_patching.seed_row(numbers)
  assert (row["probe_layer"], row["probe_head"], row["meets"]) == (0, 0, True)


def test_the_prediction_holds_at_9_of_10_seeds_and_fails_at_8(tmp_path):
  rows = []
  for arm, meeting in (("nine", 9), ("eight", 8)):
    for seed in range(10):
      probe_share = 0.8 if seed < meeting else 0.3
      rows += [{"arm": arm, "seed": seed, "layer": 0, "head": head, "found": 0.9 - 0.5 * head,
                "share": probe_share if head == 0 else 0.05} for head in range(2)]
  rows = [{**row, "size": abs(row["share"])} for row in rows]
  nine, eight = path_patching.summarise(rows, str(tmp_path))
  assert (nine["meeting"], nine["holds"], eight["meeting"], eight["holds"]) == (9, "yes", 8, "no")
  np.testing.assert_allclose(nine["p"], 11 / 1024)
  assert nine["p_adjusted"] == 2 * nine["p"]
  assert "| nine | 2 |" in (tmp_path / "verdicts.md").read_text()
  # descriptive: one head finds it (found 0.9; the other 0.4), carrying its own share
  assert (nine["finders"], nine["share_rest"]) == (1, 0.05)
  np.testing.assert_allclose(nine["share_finders"], 0.75)
