"""Did the attention-variant predictions hold? The papers' claims that
configs/ablations/attention_variants.py:accelerator tests (docs/results/attention_variants.md),
fixed before the sweep ran, as checks on its results.

  python scripts/attention_variants_predictions.py \
      --results=docs/results/attention_variants/accelerator/results.csv \
      --out=docs/results/attention_variants/predictions_accelerator.md

Measures, paired by seed, with the checks of scripts/predictions.py ("a > b": a
above b, p < 0.05; "a ~ b": a at most 0.05 above b, the 95% interval's upper end included): the
test error (1 - accuracy) at a fixed learning rate or at each variant's rate chosen on the
validation stream, and the attention weight on the first token at the end of training.
- V1 (Qiu et al. 2025): gating widens the range of learning rates that train: at 1e-2, where
  plain attention failed on the CPU, both gates err less than plain attention and than plain
  attention with as many parameters.
- V2 (Dehghani et al. 2023, Wortsman et al. 2023): QK-norm trains at a higher learning rate: at
  3e-2 it errs less than plain attention.
- V3 (Ramapuram et al. 2024): sigmoid attention with b = -log S matches softmax: within 0.05 of
  plain attention's error at the chosen rates.
- V4 (Ye et al. 2025; Qiu et al. 2025): differential attention and the feature-wise gate put
  less weight on the first token than plain attention, at the chosen rates.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.predictions import above, chosen, close  # noqa: E402
from scripts.scaling_predictions import errors  # noqa: E402


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, learning rate, checks) per prediction."""
  at_1e2, at_3e2, tuned = errors(records, 1e-2), errors(records, 3e-2), errors(records)
  first_token = chosen(records, "final_first_token_weight")
  return [
      ("V1", "1e-2", [above(at_1e2, base, gate) for gate in ("gated", "gated_headwise")
                      for base in ("mha", "mha_matched")]),
      ("V2", "3e-2", [above(at_3e2, "mha", "qk_norm")]),
      ("V3", "chosen", [close(tuned, "sigmoid", "mha")]),
      ("V4", "chosen", [above(first_token, "mha", name) for name in ("differential", "gated")]),
  ]


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "learning rate")
