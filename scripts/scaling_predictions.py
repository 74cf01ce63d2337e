"""Did the scaling predictions hold? The predictions of configs/ablations/scaling.py:accelerator
(docs/results/scaling.md), fixed before the sweep ran, as checks on its results.

  python scripts/scaling_predictions.py \
      --results=docs/results/scaling/accelerator/results.csv \
      --out=docs/results/scaling/predictions_accelerator.md

The measure is the test error, 1 - accuracy, either at each variant's learning rate chosen on
the validation stream or at the grid's largest; comparisons are paired by seed, with the checks
of scripts/heads_binding_predictions.py ("a > b": a's error above b's, p < 0.05; "a ~ b": a at
most 0.05 above b, the 95% interval's upper end below that).
- S1 (Vaswani et al. 2017, footnote 4): without the 1/sqrt(d_k), the logits' variance grows with
  d_k, the softmax saturates and learning suffers: at d_k 256 and 1024 no scaling errs more
  than 1/sqrt(d_k).
- S2: that penalty grows with d_k: (none - 1/sqrt(d_k)) at d_k 1024 above the same at d_k 64.
- S3 (Wortsman et al. 2023): at the largest learning rate QK-norm errs less than 1/sqrt(d_k)
  alone, at every d_k.
- S4: QK-norm costs nothing once the learning rate is tuned: within 0.05 of 1/sqrt(d_k) at
  every d_k.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import scaling  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.predictions import above, chosen, close  # noqa: E402

HEAD_DIMS = scaling.ACCELERATOR_HEAD_DIMS


def errors(records, learning_rate=None) -> dict[str, dict[int, float]]:
  """{variant: {seed: test error}} at the learning rate chosen on validation, or at
  ``learning_rate``."""
  if learning_rate is None:
    return chosen(records, "eval_accuracy", lambda accuracy: 1.0 - accuracy)
  by_variant = {}
  for record in records:
    metrics = record["metrics"]
    for s, lr, a in zip(metrics["seed"], metrics["learning_rate"], metrics["eval_accuracy"]):
      if lr == learning_rate:
        by_variant.setdefault(record["variant"], {})[s] = 1.0 - a
  return by_variant


def gaps(error, head_dims) -> dict[str, dict[int, float]]:
  """{"gap_<d_k>": {seed: error(none) - error(1/sqrt(d_k))}}."""
  return {f"gap_{d}": {s: error[f"dk{d}_none"][s] - error[f"dk{d}_inv_sqrt"][s]
                       for s in error[f"dk{d}_none"].keys() & error[f"dk{d}_inv_sqrt"].keys()}
          for d in head_dims}


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, learning rate, checks) per prediction."""
  tuned, at_largest = errors(records), errors(records, max(scaling.LEARNING_RATES))
  return [
      ("S1", "chosen", [above(tuned, f"dk{d}_none", f"dk{d}_inv_sqrt") for d in HEAD_DIMS[1:]]),
      ("S2", "chosen", [above(gaps(tuned, HEAD_DIMS), f"gap_{HEAD_DIMS[-1]}",
                              f"gap_{HEAD_DIMS[0]}")]),
      ("S3", "largest", [above(at_largest, f"dk{d}_inv_sqrt", f"dk{d}_qk_norm")
                         for d in HEAD_DIMS]),
      ("S4", "chosen", [close(tuned, f"dk{d}_qk_norm", f"dk{d}_inv_sqrt") for d in HEAD_DIMS]),
  ]


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "learning rate")
