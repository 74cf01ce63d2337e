"""The heads-and-length sweep: valid arms at every length, and predictions that hold on what the
theory predicts and fail on its alternatives (the probe that finds Yu et al.'s construction in
the hand-set oracle: tests/test_probe_reports.py)."""

import numpy as np
import pytest

from configs.ablations import heads_length
from experiments import findings, sweep

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("mode", [None, "quick", "accelerator"])
def test_every_arm_is_valid_and_the_contrasts_name_arms(mode):
  config = heads_length.get_config(mode)
  sweep.check(config)
  names = [name for name, _ in config.variants]
  assert len(names) == {None: 12, "quick": 12, "accelerator": 20}[mode]
  assert all(arm in names and reference in names for arm, reference in config.contrasts)
  for name, overrides in config.variants:
    heads, length = name[1:].split("_T")
    assert overrides == {"task_options": {"length": int(length)},
                         "model": {"num_heads": int(heads), "head_dim": 32}}
  assert config.train.model.num_layers == 1


def test_an_unknown_mode_is_refused():
  with pytest.raises(ValueError, match="mode must be"):
    heads_length.get_config("fast")


def _nmse(means: dict, seeds: int = heads_length.NUM_SEEDS) -> dict:
  """{arm: {seed: NMSE}} around each mean, spread differently per arm."""
  offsets = np.linspace(-0.01, 0.01, seeds)
  return {arm: {seed: max(0.0, mean + offsets[(seed * 3 + len(arm)) % seeds])
                for seed in range(seeds)} for arm, mean in means.items()}


def _study(nmse_of) -> dict:
  arms = [(h, t) for t in heads_length.LENGTHS for h in heads_length.HEADS]
  return _nmse({heads_length.name(h, t): nmse_of(h, t) for h, t in arms})


def decide(nmse):
  return findings.decide(heads_length.predictions(), values={"primary": nmse})


def test_the_predictions_hold_for_a_step_at_d_growing_with_length_and_fail_otherwise():
  held = lambda nmse: findings.held(decide(nmse))  # noqa: E731
  # Yu et al.: below D the error grows with T; from D it is near zero.
  theory = _study(lambda h, t: 0.002 if h >= 4 else (0.6 - 0.1 * h) * (1 + t / 64))
  assert all(held(theory).values()), findings.table(decide(theory), "arms")
  # A decline in proportion to the heads missing, independent of T: L1 and L3 fail.
  proportional = _study(lambda h, t: 0.002 if h >= 4 else 0.6 * (4 - h) / 3)
  assert held(proportional) == {
      "L1": False, "L2": True, "L3": False}
  # Four heads that do not suffice at the longest length: L2 fails.
  short = _study(lambda h, t: (0.3 if t == 64 else 0.002) if h >= 4 else 0.6 * (1 + t / 64))
  assert not held(short)["L2"]

