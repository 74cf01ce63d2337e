"""Did the predictions of the attention-variant controls hold? The sweep
configs/ablations/attention_variants.py:controls, its predictions fixed before it ran, as checks on
its results.

  python scripts/attention_variants_controls_predictions.py \
      --results=docs/results/attention_variants/controls/results.csv \
      --out=docs/results/attention_variants/controls/predictions.md

The measure is the number of steps until a seed first reaches test accuracy 0.9, a seed that
never does counted one evaluation past the last (900), each variant at its learning rate chosen
on the validation stream; comparisons paired by seed with the checks of scripts/predictions.py
(exact sign-flip tests, Holm over the table; "a ~ b" by two one-sided tests).

- C1 (the map count, not the subtraction): differential attention with num_heads=4 (8 softmax
  maps of width 8) solves the task no sooner than plain attention with 8 heads (8 maps of 8).
- C2: differential attention with 2 heads (4 maps of 16, as plain attention's 4 heads) solves it
  no sooner than plain attention with 4 heads.
- C3 (the gate's start): the paper's gate, which starts at 0.5, solves it later than the same
  gate started open (2 sigmoid(X W), 1 at the start).
- C4: the gate started open matches plain attention: within MARGIN_STEPS steps, by TOST.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import attention_variants  # noqa: E402
from experiments import verdicts  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.predictions import above, chosen, close, not_above  # noqa: E402

CENSORED_AT = attention_variants.STEPS + attention_variants.STEPS // 8  # one evaluation past
MARGIN_STEPS = 100  # one evaluation interval


def steps_to_solve(records) -> dict[str, dict[int, float]]:
  """{variant: {seed: steps to 0.9, CENSORED_AT where never}} at the chosen learning rates."""
  return chosen(records, verdicts.STEPS_TO,
                lambda steps: CENSORED_AT if math.isnan(steps) else min(steps, CENSORED_AT))


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, what is compared, checks) per prediction."""
  steps = steps_to_solve(records)
  return [
      ("C1", "8 maps of width 8 each", [not_above(steps, "mha_8", "differential")]),
      ("C2", "4 maps of width 16 each", [not_above(steps, "mha", "differential_2")]),
      ("C3", "the gate's start", [above(steps, "gated", "gated_open")]),
      ("C4", "the open gate", [close(steps, "gated_open", "mha", margin=MARGIN_STEPS)]),
  ]


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "compared")
