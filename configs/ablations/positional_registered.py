"""Positional encodings, pre-registered: the predictions P1-P4 of the accelerator preset at a
size two CPU cores can run, with randomized positional encodings (Ruoss et al. 2023) added.

  python -m experiments.sweep --config=configs/ablations/positional_registered.py \
      --workdir=workdir/ablations/positional_registered
  python -m experiments.sweep --config=configs/ablations/positional_registered.py:quick \
      --workdir=/tmp/pr

configs/ablations/positional.py ran one learning rate and 3 seeds with no predictions, so none of
its comparisons could reach p < 0.05. Here: the two order-dependent tasks (`even_pairs`, is the
first symbol the last?; `order`, is marker A before marker B?), trained on lengths up to 10 and
tested at 2x (11-20), 4x (21-40) and 8x (41-80); the sinusoidal, learned, rope and alibi
encodings and ``randomized``: the sinusoidal table at sorted random positions drawn from 0..80
at every training step (one fixed draw when evaluating), so that training on short strings visits
every position a test string will use. No encoding at all is left out: a CLS classifier without
positions is permutation invariant, and both tasks depend on order (it stayed at 0.49-0.62 on the
training lengths in the first study).

Sized by trial runs of `even_pairs` with the randomized encoding and ALiBi, the slowest to learn
(first symbol = last is an XOR of two positions, with no signal in either alone): at lengths up to
20 they reached 0.6-0.9 after 1500 steps, at lengths up to 10 0.87-0.995 after 2500. So
`even_pairs` trains for 3000 steps, `order` (learned within 1000 steps in the first study) for
2000; a batch of 32, two layers at d_model 64.

Each arm's learning rate is chosen from 3e-4 and 1e-3 on a validation stream of the training
lengths, extended by one rate past an edge where a choice sits on it; 10 seeds, so that the exact
paired sign-flip test (smallest p 2/1024) survives Holm over the predictions' 11 tested checks.
Predictions, committed before the run: ``predictions`` below (python -m experiments.findings).
Results, runtime and provenance: docs/results/positional_registered.md.

`:longer`, run after the sweep and outside its tests: the two `even_pairs` arms still learning at
step 3000 (ALiBi and randomized), at their chosen rate 1e-3 for twice the steps, to see whether
what they do at longer lengths changes once they fit the training lengths.
"""

import ml_collections

from configs.ablations import check_mode
from configs.ablations.positional import error_measures, extrapolation, length_sweep

TASKS = ("even_pairs", "order")
ENCODINGS = ("sinusoidal", "learned", "randomized", "rope", "alibi")
TRAIN_LENGTH = 10
TEST_LENGTHS = ((11, 20), (21, 40), (41, 80))
LEARNING_RATES = (3e-4, 1e-3)
STEPS = {"even_pairs": 3000, "order": 2000}
NUM_SEEDS, NUM_LAYERS, BATCH_SIZE = 10, 2, 32


LONGER = ("even_pairs-alibi", "even_pairs-randomized")  # :longer, at 1e-3 for 2 x 3000 steps


def get_config(mode=None):
  check_mode(mode, valid=("quick", "longer"))
  if mode == "longer":
    return longer()
  quick = mode == "quick"
  sweep = length_sweep(mode, tasks=TASKS, encodings=ENCODINGS, train_length=TRAIN_LENGTH,
                       test_lengths=TEST_LENGTHS, steps=max(STEPS.values()),
                       model_layers=NUM_LAYERS, bracket=1, seeds=NUM_SEEDS,
                       learning_rates=LEARNING_RATES,
                       predictions="configs/ablations/positional_registered.py")
  sweep.train.batch_size = BATCH_SIZE
  sweep.train.eval_every_steps = sweep.train.num_train_steps  # long test sets: evaluated at the end
  if not quick:  # each task its own length of training, evaluated halfway and at the end
    sweep.variants = tuple(
        (name, {**overrides, "num_train_steps": STEPS[overrides["task"]],
                "eval_every_steps": STEPS[overrides["task"]] // 2,
                "checkpoint_every_steps": STEPS[overrides["task"]] // 2})
        for name, overrides in sweep.variants)
  return sweep


def longer():
  """The arms of LONGER at 1e-3 for twice their steps, without bracketing."""
  sweep = get_config()
  steps = 2 * STEPS["even_pairs"]
  sweep.variants = tuple((name, {**overrides, "num_train_steps": steps,
                                 "eval_every_steps": steps // 4, "checkpoint_every_steps": steps // 2})
                         for name, overrides in sweep.variants if name in LONGER)
  sweep.grid = ml_collections.ConfigDict({"learning_rate": (1e-3,)})
  sweep.bracket = 0
  sweep.baseline, sweep.contrasts = LONGER[1], ((LONGER[0], LONGER[1]),)  # descriptive only
  sweep.predictions = ""  # a follow-up of two arms, not the study's predictions
  return sweep


LEARNED = 0.95  # the accuracy on the training lengths every seed of every arm must reach
STANDARD = ("sinusoidal", "learned", "rope", "alibi")


def predictions(mode=None) -> dict:
  """The predictions, fixed before the sweep ran (python -m experiments.findings): trained on
  lengths up to 10, the error (1 - accuracy) on each longer test set (2x: 11-20, 4x: 21-40, 8x:
  41-80) at each arm's rate chosen on the validation stream, paired by seed; "near chance":
  accuracy at most 0.6, the upper end of the 95% interval included. P1-P5 are the accelerator
  preset's of configs/ablations/positional.py at these lengths.

  - D (the design, not a prediction): every arm learns its task on the training lengths (test
    accuracy at least 0.95 in every seed at its chosen rate), so that what it does at longer
    lengths is extrapolation, not underfitting; and every chosen rate lies inside the rates
    tried.
  - P1 (Press et al. 2022): on `order` ALiBi extrapolates: at 4x and 8x it errs less than the
    sinusoidal and the learned encoding.
  - P2: on `order` at 8x ALiBi also errs less than RoPE.
  - P3 (the first positional study, Ruoss et al. 2023): on `even_pairs` at 2x RoPE errs less
    than the sinusoidal and the learned encoding.
  - P4 (Ruoss et al. 2023): on `even_pairs` no standard encoding generalises to 8x: the
    sinusoidal, learned, RoPE and ALiBi encodings are each near chance.
  - P5 (Ruoss et al. 2023, randomized): trained at positions spread over the whole range, the
    randomized encoding errs less than the sinusoidal one at 4x and 8x on both tasks.
  """
  check_mode(mode, valid=("quick",))
  return {
      "setting": "test lengths",
      "figure": "accuracy_at_chosen_rates",
      "measures": {"primary": {"column": "eval_accuracy"}, **error_measures(TEST_LENGTHS)},
      "predictions": (
          ("D", "training lengths",
           tuple(("reaches", f"{task}-{encoding}", LEARNED, {"rate_in_text": True})
                 for task in TASKS for encoding in ENCODINGS) + (("rates_inside",),)),
      ) + extrapolation(TASKS, TEST_LENGTHS, STANDARD, at=True)}
