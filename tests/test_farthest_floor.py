"""The farthest-point floor study: every arm sets what its name says, and its predictions hold on
results shaped as its hypotheses say and fail where every arm ends at the floor."""

import pytest

from configs.ablations import farthest_floor
from experiments import findings, sweep

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("mode", [None, "quick"])
def test_each_arm_sets_its_width_heads_start_temperature_and_context(mode):
  config = farthest_floor.get_config(mode)
  sweep.check(config)
  arms = {name: sweep.variant_config(config, overrides) for name, overrides in config.variants}
  assert (arms["full_1"].model.num_heads, arms["full_1"].model.d_model) == (1, 48)
  assert arms["full_1"].init == "random"
  oracle = arms["full_1_oracle_0.3"]
  assert (oracle.init, oracle.init_noise, oracle.init_beta) == ("oracle", 0.3,
                                                                farthest_floor.ORACLE_BETA)
  assert (arms["full_1_d16"].model.d_model, arms["full_1_d16"].model.num_heads) == (16, 1)
  assert arms["full_1_d16_temperature"].model.attention_scale == "learned"
  assert arms["full_1_d16_temperature"].model.d_model == 16
  assert arms["rank3_16"].model.d_model // arms["rank3_16"].model.num_heads == 3
  assert arms["short_rank3_16"].task_options.length == farthest_floor.SHORT
  assert arms["short_rank3_16_layers2"].model.num_layers == 2
  assert all(arm.task_options.length == 16 for name, arm in arms.items()
             if not name.startswith("short"))
  if mode is None:
    assert (config.num_seeds, config.bracket) == (10, 1)


def _nmse(mean_of, seeds=10, size=farthest_floor.CPU):
  return {arm: {s: mean_of(arm) + 0.005 * (s % 3) for s in range(seeds)}
          for arm, _ in farthest_floor.arms(size)}


def _held(nmse, mode=None):
  """Whether each prediction held on {arm: {seed: NMSE}} (the design's check D reads records
  and is left out)."""
  declaration = farthest_floor.predictions(mode)
  declaration["predictions"] = [p for p in declaration["predictions"] if p[0] != "D"]
  return findings.held(findings.decide(declaration, values={"primary": nmse}))


def test_the_predictions_hold_where_width_decides_and_fail_where_every_arm_learns():
  width = {"full_1": 0.05, "full_1_oracle_0.3": 0.02, "full_1_d16": 0.45,
           "full_1_d16_temperature": 0.4, "rank3_16": 0.7, "short_rank3_16": 0.5,
           "short_rank3_16_layers2": 0.2}
  held = _held(_nmse(width.get))
  assert held == {"W1": True, "W2": True, "W3": True, "O": True, "R": True, "A": True}
  learned = _held(_nmse(lambda arm: 0.02))
  assert learned == {"W1": True, "W2": False, "W3": False, "O": True, "R": False, "A": False}
  floor = _held(_nmse(lambda arm: 0.45))
  assert floor["W1"] is False and floor["O"] is False


def test_the_accelerator_preset_doubles_d_and_keeps_every_role_and_prediction():
  config = farthest_floor.get_config("accelerator")
  sweep.check(config)
  roles = farthest_floor.names(farthest_floor.ACCELERATOR)
  arms = {name: sweep.variant_config(config, overrides) for name, overrides in config.variants}
  assert set(arms) == set(roles.values())
  assert (arms["full_1"].task_options.dimension, arms["full_1"].task_options.length) == (32, 32)
  assert arms["full_1"].model.d_model >= 2 * 32 + 1  # the oracle's room
  assert arms[roles["narrow"]].model.d_model == 32
  assert (config.num_seeds, config.train.num_train_steps) == (10, 4000)
  width = {roles["full"]: 0.05, roles["oracle"]: 0.02, roles["narrow"]: 0.45,
           roles["narrow_temperature"]: 0.4, roles["low_rank"]: 0.7, roles["short"]: 0.5,
           roles["short_deep"]: 0.2}
  held = _held(_nmse(width.get, size=farthest_floor.ACCELERATOR), "accelerator")
  assert all(held.values())

