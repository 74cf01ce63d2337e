"""The probes of trained sweeps (experiments/probes.py, experiments/probe_reports.py): head
importance's summaries, and the farthest-point and max-share probes on the tasks' hand-set
solutions, where the answer is known."""

import numpy as np
import pytest

from configs.ablations import heads_length
from experiments import oracles, probe_reports, probes
from training_helpers import four_maxima_config, oracle_run, tiny_config


def test_essential_heads_and_the_top_share():
  importance = np.array([[0.5, 0.3, 0.01, -0.02], [0.2, 0.0, 0.0, 0.0]])  # [L, N]
  assert probes.essential_heads(importance, 0.05) == 3
  assert probes.top_share(importance, 1) == pytest.approx(0.5 / 1.01)  # negatives count as 0
  assert probes.top_share(importance, 3) == pytest.approx(1.0 / 1.01)
  assert np.isnan(probes.top_share(-importance.clip(0), 2))  # no head matters: no share


def test_the_farthest_point_probe_sees_the_oracle_find_every_point_and_carry_the_answer(
    data_dir):
  config = tiny_config(data_dir, task="farthest_point", **{
      "model.d_model": 48, "model.num_heads": 1, "model.num_layers": 1,
      "model.positional_encoding": "none"})
  config.task_options = {"num_train": 1, "num_test": 256}
  solved, untrained = oracle_run(config, oracles.farthest_point)
  found = probes.farthest_point_found(solved, probe_reports.NUM_EXAMPLES)
  assert found["found"] > 0.99 and found["weight"] > 0.99 and found["readable"] < 0.01
  found = probes.farthest_point_found(untrained, probe_reports.NUM_EXAMPLES)
  assert found["found"] < 0.3 and found["readable"] > 0.5
  table = probe_reports.farthest_point_table({"h1": [found] * 3})
  assert table.splitlines()[2].startswith(f"| `h1` | {found['found']:.3f} [")


def test_the_max_share_probe_finds_a_head_per_maximum_in_the_oracle(data_dir):
  config = four_maxima_config(data_dir)
  solved, _ = oracle_run(config, oracles.multi_retrieval, config.task_options.to_dict())
  share = probes.max_shares(solved, probe_reports.NUM_EXAMPLES)
  assert share.shape == (4, 4)
  np.testing.assert_allclose(np.diag(share), 1.0)  # head i attends to the argmax of maximum i
  np.testing.assert_allclose(probes.matched(share[[2, 0, 3, 1]]), 1.0)  # any order of heads
  np.testing.assert_allclose(probes.matched(share[:3]).sum(), 3.0)  # 3 heads: one max left out
  # Every maximum has its head at every length, not where one is shared.
  lengths = [heads_length.name(4, t) for t in heads_length.LENGTHS]
  assert probe_reports.every_maximum_its_head({arm: [share] * 6 for arm in lengths}, lengths)[0]
  shared = share[[0, 0, 2, 3]]  # heads 1 and 2 both on maximum 1: maximum 2 has none
  held, measured = probe_reports.every_maximum_its_head(
      {**{arm: [share] * 6 for arm in lengths}, lengths[-1]: [shared] * 6}, lengths)
  assert not held and "maximum 2 of h4_T64" in measured
  assert "| h4_T8 | 1.00 [1.00, 1.00] |" in probe_reports.max_share_table({lengths[0]: [share] * 6})


def test_a_probe_command_line_ends_a_missing_sweep_in_one_line(tmp_path):
  missing = str(tmp_path / "no_sweep")
  with pytest.raises(SystemExit) as ended:
    probe_reports.command_line("A probe.", lambda args: probe_reports.write_farthest_point(
        args.sweep, args.out), argv=[f"--sweep={missing}"])
  assert missing in str(ended.value) and "\n" not in str(ended.value)
