"""The sweep report's plots without a sweep: readable names, intervals inside each measure's
range, and the plots drawn again from results.csv alone."""

import os

import numpy as np
import pytest

from experiments import sweep_report, workdir as workdir_lib


def _records():
  rng = np.random.default_rng(0)
  records = []
  for variant, heads in (("heads_1", 1), ("heads_4", 4)):
    rates = [1e-3] * 3 + [1e-2] * 3
    accuracy = [1.0, 0.5, 1.0, 0.98, 0.99, 1.0] if heads == 1 else list(rng.uniform(0.5, 1, 6))
    records.append({"variant": variant, "status": "ok", "overrides": {"model": {"num_heads": heads}},
                    "metrics": {"name": [f"r{i}" for i in range(6)], "seed": [0, 1, 2] * 2,
                                "learning_rate": rates, "weight_decay": [0.01] * 6,
                                "warmup_steps": [10.0] * 6, "diverged_at": [0] * 6,
                                "eval_accuracy": accuracy,
                                "eval_loss": [0.01, 1.5, 0.02, 0.05, 0.04, 0.01],
                                "length_21_40_accuracy": list(rng.uniform(0, 1, 6)),
                                "length_5_20_accuracy": list(rng.uniform(0, 1, 6)),
                                "final_entropy": list(rng.uniform(0, 2, 6)),
                                "init_entropy": list(rng.uniform(0, 2, 6))}})
  return records


def test_keys_read_as_names():
  assert sweep_report.readable("eval_accuracy") == "Test accuracy"
  assert sweep_report.readable("eval_loss") == "Test loss"
  assert sweep_report.readable("length_21_40") == "length 21-40"
  assert sweep_report.readable("length_21_40_accuracy") == "Test accuracy, length 21-40"
  assert sweep_report.readable_arm("mha_4 learning_rate=0.01") == "mha_4 lr=0.01"


@pytest.mark.parametrize("name, values", [
    ("eval_accuracy", [[1.0, 0.5, 1.0], [0.0, 0.4, 0.0], [0.9]]),
    ("eval_loss", [[0.01, 1.5, 0.02], [3.0, 2.0, 4.0]])])
def test_error_bars_end_inside_the_measure_s_range(name, values):
  means, (below, above) = sweep_report._yerr(values, name)
  low, high = sweep_report.metric_range(name)
  assert np.all(means - below >= low) and np.all(means + above <= high)
  assert np.all(below >= 0) and np.all(above >= 0)
  # the first arm's t-interval (0.833 +- 0.717) passes 1: clipped above, not below
  if name == "eval_accuracy":
    assert means[0] + above[0] == 1.0 and below[0] == pytest.approx(0.717, abs=1e-3)


def test_the_plots_are_drawn_again_from_results_csv_alone(tmp_path):
  records = _records()
  sweep_report.write_csv(records, tmp_path / "results.csv")
  again = sweep_report.records_from_csv(tmp_path / "results.csv")
  assert [r["variant"] for r in again] == ["heads_1", "heads_4"]
  for record, read in zip(records, again):
    assert read["overrides"] == workdir_lib.flatten(record["overrides"])
    for name in ("eval_accuracy", "eval_loss", "learning_rate", "length_21_40_accuracy"):
      np.testing.assert_allclose(read["metrics"][name], record["metrics"][name])
    assert sweep_report.arms(read) == sweep_report.arms(record)
  paths = sweep_report.write_from_csv(str(tmp_path / "results.csv"))
  assert sorted(paths) == ["best_learning_rates", "final", "learning_rates", "lengths",
                          "probes"]
  for path in paths.values():
    assert os.path.getsize(path) > 5000


def test_table_intervals_stay_inside_the_measures_range():
  # An NMSE near 0 whose t-interval would pass below 0: the interval is clipped and bracketed,
  # in significant digits; an accuracy near 1 is clipped at 1; an interval inside stays ±.
  assert sweep_report._ci([0.0001, 0.0002, 0.0009], "eval_nmse") == "0.0004 [0, 0.0015]"
  assert sweep_report._ci([0.5, 1.0, 1.0], "eval_accuracy") == "0.833 [0.116, 1.000]"
  assert sweep_report._ci([0.4, 0.5, 0.6], "eval_accuracy") == "0.500 ± 0.248"
  assert sweep_report._ci([float("nan")], "eval_nmse") == "diverged"
