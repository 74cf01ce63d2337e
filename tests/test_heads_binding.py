"""The heads-binding sweeps: valid configs, and reports that rank NMSE lowest-first and choose
learning rates on the validation stream, not on the test set."""

import os

import numpy as np
import pytest

from configs.ablations import heads_binding
from experiments import findings, report_tables, study_figures, sweep, sweep_report, verdicts


@pytest.mark.parametrize("mode", ["multi_retrieval", "farthest_point", "multi_retrieval_quick",
                                  "farthest_point_quick"])
def test_configs_are_valid_with_both_arms_at_one_width(mode):
  config = heads_binding.get_config(mode)
  sweep.check(config)
  quick = mode.endswith("_quick")
  assert config.num_seeds == (2 if quick else heads_binding.NUM_SEEDS)
  assert len(config.grid.learning_rate) == (2 if quick else 3)
  assert set(config.extra_evals) == {"validation"}
  widths, arms = set(), {}
  for name, overrides in config.variants:
    model = sweep.variant_config(config, overrides).model
    widths.add(model.d_model)
    d_k = model.head_dim or model.d_model // model.num_heads
    arms[name] = (model.num_heads, d_k)
  d_model = widths.pop()
  assert not widths and d_model == (32 if mode.startswith("multi") else 16)
  heads = heads_binding.QUICK_HEADS if quick else heads_binding.HEADS
  assert {arms[f"split_{h}"] for h in heads} == {(h, d_model // h) for h in heads}
  assert {arms[f"fixed_{h}"] for h in heads if h > 1} == {(h, d_model) for h in heads if h > 1}
  task = mode.removesuffix("_quick")
  extra = {f"{name}_{h}": h for name, h, _ in heads_binding.EXTRA_ARMS[task]}
  assert set(arms) - {f"split_{h}" for h in heads} - {f"fixed_{h}" for h in heads} == (
      set() if quick else set(extra))
  for name, h in ({} if quick else extra).items():  # the extra arms use the standard split
    assert arms[name] == (h, d_model // h)
  layers = {name: sweep.variant_config(config, overrides).model.num_layers
            for name, overrides in config.variants}
  assert {name for name, n in layers.items() if n != 1} == {
      name for name in arms if name.startswith("layers2")}


def test_an_unknown_mode_names_the_valid_ones():
  with pytest.raises(ValueError, match="mode must be one of \\['multi_retrieval', "
                                       "'farthest_point'\\], '<task>_quick' or "
                                       "\\['multi_retrieval_accelerator'\\], got 'mqar'"):
    heads_binding.get_config("mqar")


def test_the_accelerator_preset_doubles_the_maxima_and_spans_h_around_them():
  config = heads_binding.get_config("multi_retrieval_accelerator")
  sweep.check(config)
  assert config.num_seeds >= 5 and config.vmap_replicas
  options = config.train.task_options
  assert (options.num_retrievals, options.length, options.features) == (8, 32, 16)
  arms = {}
  for name, overrides in config.variants:
    model = sweep.variant_config(config, overrides).model
    assert (model.d_model, model.num_layers) == (64, 1)
    arms[name] = (model.num_heads, model.head_dim or model.d_model // model.num_heads)
  # h = D = 8 in the middle of the split arm; the fixed head size only below D.
  assert arms == {**{f"split_{h}": (h, 64 // h) for h in (1, 2, 4, 8, 16, 32)},
                  "fixed_2": (2, 64), "fixed_4": (4, 64)}


def _record(variant, by_rate):
  """A finished variant: {learning rate: (eval_nmse, validation_nmse)} over 2 seeds each."""
  metrics = {key: [] for key in ("name", "seed", "learning_rate", "weight_decay", "warmup_steps",
                                 "eval_loss", "eval_nmse", "validation_loss", "validation_nmse",
                                 "diverged_at", "seconds", "parameters", "num_classes")}
  for rate, (test, validation) in by_rate.items():
    for seed, jitter in enumerate((-0.01, 0.01)):
      row = {"name": f"seed_{seed}-learning_rate_{rate:g}", "seed": seed, "learning_rate": rate,
             "weight_decay": 0.01, "warmup_steps": 100.0, "eval_loss": test + jitter,
             "eval_nmse": test + jitter, "validation_loss": validation + jitter,
             "validation_nmse": validation + jitter, "diverged_at": 0, "seconds": 1.0,
             "parameters": 10, "num_classes": 4}
      for key, value in row.items():
        metrics[key].append(value)
  return {"variant": variant, "overrides": {}, "status": "ok", "metrics": metrics}


def test_the_report_ranks_nmse_lowest_first_and_picks_rates_on_validation():
  # Variant a: the test set would pick 1e-3 (0.10), the validation stream picks 3e-3 (0.20).
  records = [_record("a", {1e-3: (0.10, 0.30), 3e-3: (0.40, 0.20)}),
             _record("b", {1e-3: (0.80, 0.80), 3e-3: (0.90, 0.90)})]
  chosen = {c.variant: c.learning_rate for c in verdicts.choose(records, "nmse")}
  assert chosen == {"a": 3e-3, "b": 1e-3}
  assert report_tables.measure_of(records) == "nmse"
  design = verdicts.Design(baseline="a", comparisons=(("b", "a"),), test="paired_permutation",
                           primary="eval_nmse", solved_at=0.1, censored_at=100.0)
  (comparison,) = verdicts.compare(verdicts.choose(records, "nmse"), design)
  assert comparison.estimate == pytest.approx(0.8 - 0.4)  # b at 1e-3 minus a at 3e-3
  assert verdicts.verdict(comparison, design) == "no difference detected (2 seeds)"


def test_a_tiny_regression_sweep_writes_its_report(data_dir, tmp_path):
  """Both arms of a shrunk farthest_point sweep train, and the report (learning curves, steps to
  NMSE 0.1, the validation stream's choice) and its plots are written."""
  config = heads_binding.get_config("farthest_point_quick")
  config.train.data_dir = data_dir
  config.train.task_options = {"length": 6, "dimension": 4, "num_train": 256, "num_test": 32}
  config.train.model.update(d_model=4, mlp_dim=8, num_layers=1)
  config.train.update(num_train_steps=4, eval_every_steps=2, checkpoint_every_steps=4,
                      batch_size=16)
  config.variants = tuple(heads_binding.variants("farthest_point", 4, (2,)))
  config.baseline = "split_2"
  records = sweep.run_sweep(config, str(tmp_path))
  assert [r["status"] for r in records] == ["ok", "ok"]
  paths = sweep_report.write(records, str(tmp_path), verdicts.Design.of_sweep(config, "nmse"),
                             tuple(config.extra_evals))
  with open(paths["markdown"]) as f:
    report = f.read()
  assert "Validation nmse" in report and "solved (<= 0.1)" in report
  assert {"curves", "learning_rates", "chosen", "final", "comparisons"} <= set(paths)
  assert "lengths" not in paths  # its only extra test set is the validation stream
  # Head importance of every seed at the learning rate the report chose: one value per head.
  from experiments import probe_reports
  rates = probe_reports.chosen_rates(records)
  importances = probe_reports.variant_importances(str(tmp_path / "variants" / "fixed_2"),
                                                  rates["fixed_2"])
  assert len(importances) == config.num_seeds
  assert all(i.shape == (1, 2) and np.all(np.isfinite(i)) for i in importances)
  text = probe_reports.importance_table({"fixed_2": importances}, 0.05, 1)
  assert text.splitlines()[2].startswith("| fixed_2 | 2 | 2 |")
  probe_reports.importance_plot({"fixed_2": importances}, str(tmp_path / "importance.png"),
                                "NMSE added")
  assert os.path.getsize(tmp_path / "importance.png") > 5000


def _nmse(means: dict, seeds: int = 10) -> dict:
  """{variant: {seed: NMSE}}: ``seeds`` seeds around each mean, the same seed offsets in every
  variant (10: enough for the exact tests to pass Holm over a table's checks)."""
  offsets = np.linspace(-0.02, 0.02, seeds)
  return {variant: {seed: mean + offsets[seed] * (1 + (seed * 7 + len(variant)) % 3 / 10)
                    for seed in range(seeds)} for variant, mean in means.items()}


# What the theory predicts (every check holds) ...
THEORY_MR = {"split_1": 0.6, "split_2": 0.4, "split_4": 0.05, "split_8": 0.05, "split_16": 0.06,
             "fixed_2": 0.4, "fixed_4": 0.05, "fixed_8": 0.05, "fixed_16": 0.05,
             "layers2_1": 0.45, "layers2_2": 0.1, "talking_heads_2": 0.35}
THEORY_FP = {"split_1": 0.2, "split_2": 0.3, "split_4": 0.5, "split_8": 0.7, "split_16": 0.8,
             "fixed_2": 0.2, "fixed_4": 0.19, "fixed_8": 0.2, "fixed_16": 0.18,
             "layers2_16": 0.75, "talking_heads_16": 0.3, "dcmha_16": 0.25}


def _decide(mr, fp):
  return findings.decide(heads_binding.predictions("multi_retrieval"),
                         values={"multi_retrieval": mr, "farthest_point": fp})


def test_the_predictions_hold_on_what_the_theory_predicts_and_fail_on_its_opposite():
  decided = _decide(_nmse(THEORY_MR), _nmse(THEORY_FP))
  assert [number for number, _, _ in decided] == list(range(1, 10))
  outcomes = {number: findings.outcome(checks) for number, _, checks in decided}
  # 5 and 7 rest on "not above" without a margin: null predictions no test can show.
  assert outcomes == {**dict.fromkeys(range(1, 10), True), 5: None, 7: None}, outcomes
  # No effect of the head count anywhere (the flat curves of a task where heads do not bind):
  flat = {variant: 0.3 for variant in THEORY_MR}
  decided = _decide(_nmse(flat), _nmse({variant: 0.3 for variant in THEORY_FP}))
  assert findings.held(decided) == {1: False, 2: False, 3: True, 4: False, 5: False,
                                    6: False, 7: False, 8: False, 9: False}
  checks = {n: checks for n, _, checks in decided}
  assert [check[1] for check in checks[9]] == [None]  # 8, 9: no gap to recover, untestable
  table = findings.table(_decide(_nmse(THEORY_MR), _nmse(THEORY_FP)), "task")
  assert table.count("**yes**") == 7 and table.count("**not tested**") == 2
  assert "split_1 - split_4 = +0.55" in table
  # With 5 seeds the exact tests cannot pass Holm: nothing "above" can be shown.
  assert not findings.held(_decide(_nmse(THEORY_MR, 5), _nmse(THEORY_FP, 5)))[1]


THEORY_D8 = {"split_1": 0.6, "split_2": 0.5, "split_4": 0.35, "split_8": 0.001,
             "split_16": 0.001, "split_32": 0.002, "fixed_2": 0.45, "fixed_4": 0.3}


def _decide_d8(mr):
  return findings.decide(heads_binding.predictions("multi_retrieval_accelerator"),
                         values={"primary": mr})


def test_the_accelerator_predictions_hold_at_a_step_at_d_and_fail_at_a_step_at_four():
  decided = _decide_d8(_nmse(THEORY_D8))
  assert [number for number, _, _ in decided] == ["A1", "A2", "A3"]
  assert all(findings.held(decided).values()), findings.table(decided, "task")
  # The step of D = 4 (solved from h = 4): A1 and A2 fail, A3 still holds.
  at_four = {**THEORY_D8, "split_4": 0.001, "fixed_4": 0.001}
  assert list(findings.held(_decide_d8(_nmse(at_four))).values()) == [False, False, True]


def test_the_head_count_plot_draws_both_tasks(tmp_path):
  path = tmp_path / "nmse_by_heads.png"
  study_figures.heads_binding(
      {"multi_retrieval": _nmse(THEORY_MR), "farthest_point": _nmse(THEORY_FP)}, str(path))
  assert os.path.getsize(path) > 10000
  study_figures.heads_binding({"D = 8": _nmse(THEORY_D8)}, str(path),
                              heads_binding.ACCELERATOR["multi_retrieval"][2])  # fixed: 2 and 4
  assert os.path.getsize(path) > 10000


def test_the_predictions_read_each_variant_at_its_chosen_learning_rate():
  records = [_record("a", {1e-3: (0.10, 0.30), 3e-3: (0.40, 0.20)})]
  assert findings.Measure("eval_nmse").of(records) == {"a": {0: pytest.approx(0.39), 1: pytest.approx(0.41)}}
