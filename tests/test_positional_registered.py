"""The pre-registered positional study: every task and encoding is an arm with its own length of
training, and its predictions hold on results shaped as the literature says and fail where every
encoding extrapolates alike."""

import pytest

from configs.ablations import positional_registered as study
from experiments import findings, sweep
from results_helpers import accuracies, write_results

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("mode", [None, "quick"])
def test_every_task_and_encoding_is_an_arm_trained_for_its_task_steps(mode):
  config = study.get_config(mode)
  sweep.check(config)
  arms = {name: sweep.variant_config(config, overrides) for name, overrides in config.variants}
  assert set(arms) == {f"{t}-{e}" for t in study.TASKS for e in study.ENCODINGS}
  for name, arm in arms.items():
    task, encoding = name.split("-")
    assert (arm.task, arm.model.positional_encoding) == (task, encoding)
    assert arm.model.max_length == study.TEST_LENGTHS[-1][1]
    assert arm.task_options.max_length == study.TRAIN_LENGTH
    if mode is None:
      assert arm.num_train_steps == study.STEPS[task]
  assert set(config.contrasts) == {(f"{t}-{e}", f"{t}-sinusoidal") for t in study.TASKS
                                   for e in study.ENCODINGS if e != "sinusoidal"}
  if mode is None:
    assert (config.num_seeds, config.bracket) == (10, 1)


def _records(tmp_path, accuracy):
  """results of every arm at every rate; ``accuracy(task, encoding, set, seed)`` the test
  accuracy on ``set`` (0 the training lengths, 1-3 the 2x, 4x and 8x test sets)."""
  sets = ["eval"] + [f"length_{low}_{high}" for low, high in study.TEST_LENGTHS]
  rows = [(f"{task}-{encoding}", seed, lr, "",
           accuracies(**{name: accuracy(task, encoding, i, seed) - (lr != 1e-3) * 0.01
                         for i, name in enumerate(sets)},
                      validation=0.99 - (lr != 1e-3) * 0.01))
          for task in study.TASKS for encoding in study.ENCODINGS for lr in study.LEARNING_RATES
          for seed in range(10)]
  return write_results(tmp_path / "results.csv", rows)


def _decide(records):
  return findings.decide(study.predictions(), {findings.RESULTS: records})


def test_the_predictions_hold_as_the_literature_says_and_fail_where_all_extrapolate(tmp_path):

  def literature(task, encoding, test_set, seed):
    jitter = 0.002 * (seed % 3)
    if test_set == 0:
      return 0.99 - jitter
    if task == "order":
      good = {"alibi": 0.95, "randomized": 0.9, "rope": 0.8}.get(encoding, 0.6)
      return good - 0.05 * test_set - jitter
    if encoding == "rope" and test_set == 1:
      return 0.9 - jitter
    return (0.85 if encoding == "randomized" else 0.52) - jitter

  held = findings.held(_decide(_records(tmp_path, literature)))
  assert held == {"D": False, "P1": True, "P2": True, "P3": True, "P4": True, "P5": True}
  alike = findings.held(_decide(
      _records(tmp_path, lambda task, encoding, test_set, seed: 0.9 - 0.002 * (seed % 3))))
  assert alike == {"D": False, "P1": False, "P2": False, "P3": False, "P4": False, "P5": False}


def test_the_design_asks_every_arm_to_learn_the_training_lengths(tmp_path):
  slow = lambda task, encoding, test_set, seed: 0.9 if (encoding, seed) == ("alibi", 4) else 0.99
  design = dict((name, checks) for name, _, checks in _decide(_records(tmp_path, slow)))["D"]
  checks = {name: held for name, held, _ in design}
  assert checks["even_pairs-alibi >= 0.95 in every seed"] is False
  assert checks["order-rope >= 0.95 in every seed"] is True
  assert checks["every chosen rate inside the rates tried"] is False  # 1e-3 is the grid's top


def test_the_longer_runs_are_the_two_unconverged_arms_at_their_rate_for_twice_the_steps():
  config = study.get_config("longer")
  sweep.check(config)
  arms = {name: sweep.variant_config(config, overrides) for name, overrides in config.variants}
  assert set(arms) == set(study.LONGER)
  assert all(arm.num_train_steps == 2 * study.STEPS["even_pairs"] for arm in arms.values())
  assert tuple(config.grid.learning_rate) == (1e-3,) and config.bracket == 0
