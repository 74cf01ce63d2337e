"""Did the positional-encoding predictions hold? The predictions of
configs/ablations/positional.py:accelerator (docs/results/positional.md), fixed before the sweep
ran, as checks on its results.

  python scripts/positional_predictions.py \
      --results=docs/results/positional/accelerator/results.csv \
      --out=docs/results/positional/predictions_accelerator.md

Trained on lengths up to 64; the measure is the error (1 - accuracy) on each longer test set at
each variant's learning rate chosen on the validation stream (training lengths), paired by seed,
with the checks of scripts/predictions.py ("a > b": a's error above b's, p < 0.05)
and "a near chance": a's accuracy at most 0.6, the 95% interval's upper end included.
- P1 (Press et al. 2022): on `order` ALiBi extrapolates: at 4x and 8x the training length it
  errs less than the sinusoidal and the learned encoding.
- P2: on `order` at 8x ALiBi also errs less than RoPE (its distance penalty keeps attention
  local, RoPE's rotation angles at unseen distances are new).
- P3 (this study on the CPU, Ruoss et al. 2023): on `even_pairs` at 2x RoPE errs less than the
  sinusoidal and the learned encoding.
- P4 (Ruoss et al. 2023): on `even_pairs` no encoding generalises to 8x: each is near chance.
- P5 (Ruoss et al. 2023, added with the randomized arm before the preset ever ran): randomized
  positions err less than the sinusoidal encoding at 4x and 8x on both tasks.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import positional  # noqa: E402
from experiments import statistics  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.predictions import above, chosen  # noqa: E402

TASKS, _, TEST_LENGTHS = positional.ACCELERATOR[:3]
CHANCE_MARGIN = 0.6  # accuracy; chance is 0.5 on both tasks


def errors(records, low: int, high: int) -> dict[str, dict[int, float]]:
  """{variant: {seed: error on lengths low..high}} at each variant's chosen learning rate."""
  return chosen(records, f"length_{low}_{high}_accuracy", lambda accuracy: 1.0 - accuracy)


def near_chance(error, a):
  accuracy = [1.0 - e for e in error[a].values()]
  mean, low, high = statistics.mean_interval(accuracy, 0.0, 1.0)
  return (f"{a} near chance (accuracy <= {CHANCE_MARGIN:g})", high <= CHANCE_MARGIN,
          f"{a} accuracy {mean:.3f} [{low:.3f}, {high:.3f}], {len(accuracy)} seeds")


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, test lengths, checks) per prediction."""
  (low2, high2), (low4, high4), (low8, high8) = TEST_LENGTHS
  at = {length: errors(records, *length) for length in TEST_LENGTHS}
  x2, x4, x8 = (at[length] for length in TEST_LENGTHS)
  return [
      ("P1", f"order, {low4}-{high4} and {low8}-{high8}",
       [above(error, f"order-{other}", "order-alibi") for error in (x4, x8)
        for other in ("sinusoidal", "learned")]),
      ("P2", f"order, {low8}-{high8}", [above(x8, "order-rope", "order-alibi")]),
      ("P3", f"even_pairs, {low2}-{high2}",
       [above(x2, f"even_pairs-{other}", "even_pairs-rope") for other in ("sinusoidal", "learned")]),
      ("P4", f"even_pairs, {low8}-{high8}",
       [near_chance(x8, f"even_pairs-{name}") for name in positional.ENCODINGS]),
      ("P5", f"both tasks, {low4}-{high4} and {low8}-{high8}",
       [above(error, f"{task}-sinusoidal", f"{task}-randomized") for task in TASKS
        for error in (x4, x8)]),
  ]


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "test lengths")
