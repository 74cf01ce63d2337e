"""Sweep configs for experiments.sweep; ``sweep_config`` holds what they share.

Every sweep declares its ``baseline`` (the arm every other arm is compared with) and may declare
``contrasts``, (arm, reference) pairs that replace "every arm against the baseline" (a study
whose arms fall into groups, such as one d_k per group, compares within each group). The
comparisons are fixed here, before any run, never chosen from the results.
"""

import ml_collections

from configs import default


#: An extra evaluation on another data seed's test split, examples the training and test sets do
#: not hold: the stream the report chooses each variant's learning rate on ("validation").
VALIDATION = {"validation": {"seed": 1, "num_train": 1}}


def validation_streams(extra_evals: dict, primary: str) -> dict:
  """VALIDATION, and where ``primary`` is read on an extra test set (``length_41_80_accuracy``
  on ``length_41_80``), that set on the validation stream's data seed too
  (``validation_length_41_80``), so that each variant's rate is chosen for the outcome measured.

  >>> sorted(validation_streams({"length_41_80": {"min_length": 41}}, "length_41_80_accuracy"))
  ['validation', 'validation_length_41_80']
  >>> sorted(validation_streams({"length_41_80": {"min_length": 41}}, ""))
  ['validation']
  """
  (name, seed), = VALIDATION.items()
  on = [extra for extra in extra_evals if primary.startswith(f"{extra}_")]
  return {name: seed, **{f"{name}_{extra}": {**extra_evals[extra], **seed} for extra in on}}


#: The level a study's family of comparisons is tested at, after Holm. A study declares it and
#: the sweep refuses, before training, a design whose test and seeds cannot reach it; a quick
#: smoke test declares none (it claims nothing).
ALPHA = 0.05


def check_mode(mode, valid=("quick", "accelerator")) -> None:
  """Refuses a config mode other than None or ``valid``, naming the valid ones."""
  if mode not in (None, *valid):
    raise ValueError(f"mode must be {' or '.join(map(repr, valid))} (or none), got {mode!r}.")


def sweep_config(mode, *, steps: int, eval_every: int, warmup: int, variants, baseline: str,
                 contrasts=(), test="paired_permutation", primary="", bracket=2,
                 extra_evals=None, base=default, seeds=3, learning_rates=(),
                 predictions="") -> ml_collections.ConfigDict:
  """A sweep over ``variants`` of the training config of module ``base`` (configs.default):
  ``seeds`` seeds x the grid ``learning_rates``, ``steps`` steps; mode "quick" trains a tenth of
  them on a smaller dataset (2 seeds, two evaluations, no level, no predictions). A validation
  stream (VALIDATION) chooses each variant's learning rate; ``baseline`` and ``contrasts``: the
  module's docstring. ``test`` (experiments/statistics.py TESTS) on ``primary`` (default: the
  test set's accuracy or NMSE) at level ALPHA; ``bracket``: how many rates the sweep may add past
  an edge of the grid where an optimum sits (experiments/sweep.py), within ``budget_minutes``;
  ``predictions``: the study's declaration, "<config path>:<mode>" (experiments.findings). The
  caller adjusts ``sweep.train`` (the shared training config) afterwards.
  """
  quick = mode == "quick"
  train = base.get_config()
  train.num_train_steps = steps // 10 if quick else steps
  train.eval_every_steps = train.num_train_steps // 2 if quick else eval_every
  train.checkpoint_every_steps = max(train.eval_every_steps, train.num_train_steps // 4)
  train.warmup_steps = 10 if quick else warmup
  train.attention_maps = 0
  if quick:
    train.task_options.num_train = 2000
    train.task_options.num_test = 256

  sweep = ml_collections.ConfigDict()
  sweep.train = train
  sweep.num_seeds = 2 if quick else seeds
  sweep.grid = ml_collections.ConfigDict(  # hyperparameter -> values; replicas = seeds x grid
      {"learning_rate": learning_rates} if learning_rates else {})
  sweep.vmap_replicas = True  # the replicas of a variant train in one vmapped program
  sweep.replicas_per_program = 0  # or programs of this many replicas each (0: all in one)
  sweep.extra_evals = ml_collections.ConfigDict(
      {**(extra_evals or {}), **validation_streams(extra_evals or {}, primary)})
  sweep.variants = tuple(variants)
  sweep.baseline = baseline
  sweep.contrasts = tuple(tuple(pair) for pair in contrasts)
  sweep.test = test
  sweep.primary = primary
  sweep.alpha = None if quick else ALPHA
  sweep.effect = None  # the smallest effect a study must be able to show (experiments/verdicts.py)
  sweep.spread = 0.0  # the sd of a seed's difference it assumes for that effect
  sweep.predictions = "" if quick else predictions  # read by experiments.findings
  sweep.bracket = 0 if quick else bracket
  sweep.budget_minutes = 30
  return sweep
