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
Predictions, committed before the run: scripts/positional_registered_predictions.py. Results,
runtime and provenance: docs/results/positional_registered.md.

`:longer`, run after the sweep and outside its tests: the two `even_pairs` arms still learning at
step 3000 (ALiBi and randomized), at their chosen rate 1e-3 for twice the steps, to see whether
what they do at longer lengths changes once they fit the training lengths.
"""

import ml_collections

from configs.ablations import check_mode
from configs.ablations.positional import length_sweep

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
                       model_layers=NUM_LAYERS)
  sweep.train.batch_size = BATCH_SIZE
  sweep.train.eval_every_steps = sweep.train.num_train_steps  # long test sets: evaluated at the end
  if not quick:  # each task its own length of training, evaluated halfway and at the end
    sweep.variants = tuple(
        (name, {**overrides, "num_train_steps": STEPS[overrides["task"]],
                "eval_every_steps": STEPS[overrides["task"]] // 2,
                "checkpoint_every_steps": STEPS[overrides["task"]] // 2})
        for name, overrides in sweep.variants)
  sweep.bracket = 0 if quick else 1
  if not quick:
    sweep.num_seeds = NUM_SEEDS
  sweep.grid = ml_collections.ConfigDict({"learning_rate": LEARNING_RATES})
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
  return sweep
