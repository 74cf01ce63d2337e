"""The scaling ablation's configs and the accelerator study's predictions."""

import csv

import numpy as np
import pytest

from configs.ablations import scaling
from experiments import sweep, sweep_report
from test_heads_binding import _script


@pytest.mark.parametrize("mode", [None, "quick", "accelerator"])
def test_each_arm_sets_d_k_and_the_scale_at_one_width(mode):
  config = scaling.get_config(mode)
  sweep.check(config)
  head_dims = {"quick": scaling.HEAD_DIMS[:2],
               "accelerator": scaling.ACCELERATOR_HEAD_DIMS}.get(mode, scaling.HEAD_DIMS)
  scales = scaling.ACCELERATOR_SCALES if mode == "accelerator" else tuple(scaling.SCALES)
  arms = {}
  for name, overrides in config.variants:
    model = sweep.variant_config(config, overrides).model
    assert (model.d_model, model.num_heads) == (64, 1)
    arms[name] = (model.head_dim, model.attention_scale, model.normalize_qk)
  assert set(arms) == {f"dk{d}_{s}" for d in head_dims for s in scales}
  assert arms[f"dk{head_dims[-1]}_none"][1] == "none" and arms[f"dk{head_dims[0]}_qk_norm"][2]
  if mode == "accelerator":
    assert (config.num_seeds, config.train.num_train_steps) == (6, 1000)
    assert set(config.extra_evals) == {"validation"}  # the learning rate is chosen there


def test_an_unknown_mode_names_the_valid_ones():
  with pytest.raises(ValueError, match="'quick' or 'accelerator'"):
    scaling.get_config("gpu")


def _results(path, error):
  """A results.csv with test (and validation) error ``error(variant, learning_rate, seed)``."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["variant", "seed", "learning_rate", "weight_decay", "warmup_steps", "status",
                     "diverged_at",
                     "model.head_dim", "eval_accuracy", "eval_loss", "validation_accuracy",
                     "validation_loss"])
    for d in scaling.ACCELERATOR_HEAD_DIMS:
      for scale in scaling.ACCELERATOR_SCALES:
        for lr in scaling.LEARNING_RATES:
          for seed in range(6):
            e = error(d, scale, lr, seed)
            writer.writerow([f"dk{d}_{scale}", seed, lr, 0.01, 60, "ok", 0, d, 1 - e, e, 1 - e, e])
  return sweep_report.records_from_csv(path)


def _held(rows):
  return {name: all(check[1] for check in checks) for name, _, checks in rows}


def test_the_predictions_hold_where_the_literature_says_and_fail_where_scale_is_harmless(
    tmp_path):
  script = _script("scaling_predictions")
  noise = lambda d, scale, lr, seed: 0.01 * np.sin(7 * seed + d + 3 * lr)

  def literature(d, scale, lr, seed):  # saturation grows with d_k; QK-norm survives lr 0.1
    error = 0.1 + (0.0002 * d if scale == "none" else 0.0) + noise(d, scale, lr, seed)
    return error + (0.4 if lr == 0.1 and scale != "qk_norm" else 0.0)

  records = _results(tmp_path / "literature.csv", literature)
  rows = script.predictions(script.errors(records), script.errors(records, 0.1))
  assert _held(rows) == {"S1": True, "S2": True, "S3": True, "S4": True}
  harmless = lambda d, scale, lr, seed: 0.1 + noise(d, scale, lr, seed)
  records = _results(tmp_path / "harmless.csv", harmless)
  rows = script.predictions(script.errors(records), script.errors(records, 0.1))
  assert _held(rows) == {"S1": False, "S2": False, "S3": False, "S4": True}
