"""The sweep report without a sweep: readable names, intervals inside each measure's range, and
the report and plots made again from results.csv alone."""

import os

import numpy as np
import pytest

from experiments import report_plots, report_tables, sweep_report, verdicts
from experiments import workdir as workdir_lib

DESIGN = verdicts.Design(baseline="heads_1", comparisons=(("heads_4", "heads_1"),),
                         test="paired_permutation", primary="eval_accuracy", solved_at=0.9,
                         censored_at=110.0)


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
                                "validation_accuracy": accuracy,
                                "validation_loss": [0.01, 1.5, 0.02, 0.05, 0.04, 0.01],
                                verdicts.VALIDATION_STEPS_TO: [200.0] * 6,
                                "final_entropy": list(rng.uniform(0, 2, 6)),
                                "init_entropy": list(rng.uniform(0, 2, 6))}})
  return records


def test_keys_read_as_names():
  assert report_tables.readable("eval_accuracy") == "Test accuracy"
  assert report_tables.readable("eval_loss") == "Test loss"
  assert report_tables.readable("length_21_40") == "length 21-40"
  assert report_tables.readable("length_21_40_accuracy") == "Test accuracy, length 21-40"
  assert report_tables.readable_arm("mha_4 learning_rate=0.01") == "mha_4 lr=0.01"
  assert report_plots.label("dk64_qk_norm", "dₖ = 64") == "QK-norm"
  assert report_plots.label("even_pairs-none") == "even pairs-none"  # not a scale
  assert report_plots.label("even_pairs-none", "even_pairs") == "none"


@pytest.mark.parametrize("name, values", [
    ("eval_accuracy", [[1.0, 0.5, 1.0], [0.0, 0.4, 0.0], [0.9]]),
    ("eval_loss", [[0.01, 1.5, 0.02], [3.0, 2.0, 4.0]])])
def test_error_bars_end_inside_the_measure_s_range(name, values):
  means, (below, above) = report_plots.yerr(values, name)
  low, high = report_tables.metric_range(name)
  assert np.all(means - below >= low) and np.all(means + above <= high)
  assert np.all(below >= 0) and np.all(above >= 0)
  if name == "eval_accuracy":  # one seed: no interval; the interval is cut at the range
    assert below[2] == above[2] == 0 and means[0] + above[0] == 1.0


def test_the_report_is_made_again_from_results_csv_alone(tmp_path):
  records = _records()
  sweep_report.write_csv(records, tmp_path / "results.csv", DESIGN)
  again, design = sweep_report.read_csv(tmp_path / "results.csv")
  assert design == DESIGN
  with open(tmp_path / "results.csv") as f:
    header = f.readline().strip().split(",")
  assert len(header) == len(set(header))  # each column once
  # a CSV that repeats a column (written before that was fixed) reads it once, aligned
  with open(tmp_path / "results.csv") as f:
    lines = f.read().splitlines()
  at = header.index("eval_accuracy")
  with open(tmp_path / "repeated.csv", "w") as f:
    f.write("\n".join(f"{line},{line.split(',')[at]}" for line in lines) + "\n")
  twice, _ = sweep_report.read_csv(tmp_path / "repeated.csv")
  assert all(len(values) == len(r["metrics"]["seed"])
             for r in twice for values in r["metrics"].values())
  assert [r["variant"] for r in again] == ["heads_1", "heads_4"]
  for record, read in zip(records, again):
    assert read["overrides"] == workdir_lib.flatten(record["overrides"])
    for name in ("eval_accuracy", "eval_loss", "learning_rate", "length_21_40_accuracy"):
      np.testing.assert_allclose(read["metrics"][name], record["metrics"][name])
    assert report_tables.arms(read) == report_tables.arms(record)
  paths = sweep_report.write_from_csv(str(tmp_path / "results.csv"))
  assert sorted(paths) == ["chosen", "comparisons", "final", "learning_rates", "lengths",
                           "markdown", "probes"]
  for kind, path in paths.items():
    assert os.path.getsize(path) > (5000 if path.endswith(".png") else 100), kind


def _by_rate(records, rate):
  """``records`` cut to the runs at learning rate ``rate``: one part of a sweep split by rate."""
  part = []
  for record in records:
    keep = [i for i, r in enumerate(record["metrics"]["learning_rate"]) if r == rate]
    part.append({**record, "metrics": {k: [v[i] for i in keep]
                                       for k, v in record["metrics"].items()}})
  return part


def test_a_design_run_as_sweeps_split_by_rate_merges_into_the_whole_sweep_s_report(tmp_path):
  records = _records()
  sweep_report.write_csv(records, tmp_path / "whole.csv", DESIGN)
  for rate in (1e-3, 1e-2):
    sweep_report.write_csv(_by_rate(records, rate), tmp_path / f"part_{rate:g}.csv", DESIGN)
  parts = [str(tmp_path / "part_0.001.csv"), str(tmp_path / "part_0.01.csv")]
  sweep_report.merge_csv(parts, tmp_path / "merged" / "results.csv")
  whole, merged = (verdicts.compare_both(
      verdicts.choose(*(lambda r: (r, sweep_report.measure_of(r)))(
          sweep_report.read_csv(path)[0]), DESIGN), DESIGN)
      for path in (tmp_path / "whole.csv", tmp_path / "merged" / "results.csv"))
  assert merged == whole and whole
  with pytest.raises(ValueError, match="repeats runs"):
    sweep_report.merge_csv(parts + parts[:1], tmp_path / "twice.csv")
  other = DESIGN.__class__(**{**DESIGN.__dict__, "baseline": "heads_4",
                              "comparisons": (("heads_1", "heads_4"),)})
  sweep_report.write_csv(_by_rate(records, 1e-2), tmp_path / "other.csv", other)
  with pytest.raises(ValueError, match="different designs"):
    sweep_report.merge_csv(parts[:1] + [str(tmp_path / "other.csv")], tmp_path / "mixed.csv")
  # a part with one variant's runs missing, or written with other columns
  lacking = [records[0]] + _by_rate(records[1:], 1e-2)
  sweep_report.write_csv(lacking, tmp_path / "lacking.csv", DESIGN)
  with pytest.raises(ValueError, match="heads_4 has no run at seed 0, learning rate 0.001"):
    sweep_report.merge_csv([str(tmp_path / "lacking.csv")], tmp_path / "holey.csv")
  fewer = [{**r, "metrics": {k: v for k, v in r["metrics"].items() if k != "init_entropy"}}
           for r in _by_rate(records, 1e-2)]
  sweep_report.write_csv(fewer, tmp_path / "fewer.csv", DESIGN)
  with pytest.raises(ValueError, match="other columns"):
    sweep_report.merge_csv(parts[:1] + [str(tmp_path / "fewer.csv")], tmp_path / "cols.csv")


def test_table_intervals_stay_inside_the_measures_range_in_one_style():
  assert report_tables.mean_cell([0.0001, 0.0002, 0.0009], "eval_nmse").startswith("0.0004 [")
  cell = report_tables.mean_cell([0.5, 1.0, 1.0], "eval_accuracy")
  low, high = (float(x) for x in cell.split("[")[1].rstrip("]").split(", "))
  assert cell.startswith("0.833 [") and 0.0 <= low and high == 1.0  # t interval cut at 1
  assert report_tables.mean_cell([0.578] * 3, "eval_accuracy") == "0.578"
  assert report_tables.mean_cell([float("nan")], "eval_nmse") == "diverged"
  # a small nonzero difference shows as nonzero
  assert report_tables.interval_cell(-0.00043, -0.0005, -0.0003) == "-0.00043 [-0.0005, -0.0003]"


def test_a_csv_the_report_cannot_use_is_refused_in_one_line(tmp_path):
  import subprocess
  import sys
  (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
  records = _records()
  sweep_report.write_csv(records, tmp_path / "old.csv")  # no design: from before designs
  for name, message in (("bad.csv", "not a sweep's results.csv"),
                        ("old.csv", "does not say what its study compares"),
                        ("missing.csv", "No such file")):
    result = subprocess.run([sys.executable, "-m", "experiments.sweep_report", "--from_csv",
                             str(tmp_path / name)], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr


def test_the_design_paragraph_counts_the_comparisons_this_run_tested():
  design = verdicts.Design(baseline="heads_1", comparisons=(("heads_4", "heads_1"),
                                                           ("heads_8", "heads_1")),
                           test="paired_permutation", primary="eval_accuracy", solved_at=0.9,
                           censored_at=110.0)
  records = _records()  # heads_1 and heads_4 only: one of the two declared comparisons ran
  chosen = verdicts.choose(records, "accuracy", design)
  (line, _) = report_tables.design_lines(design, chosen, 3, False)
  assert "and 1 comparison," in line and "declares 2; 1 of them" in line


@pytest.mark.parametrize("label", ["h4", "dk64 QK-norm learned temperature"])
def test_the_legend_under_the_panels_fits_the_figure_s_width(label):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axes = plt.subplots(1, 1, figsize=(4.8, 4), squeeze=False)
  for i in range(4):
    axes[0, 0].plot([0, 1], [i, i], label=f"{label} {i}")
  report_plots._finish(figure, list(axes.flat), 1)
  figure.canvas.draw()
  (legend,) = figure.legends
  box = legend.get_window_extent()
  assert 0 <= box.x0 and box.x1 <= figure.bbox.width, (box, figure.bbox.width)
  plt.close(figure)
