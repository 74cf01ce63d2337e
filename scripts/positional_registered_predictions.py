"""Did the pre-registered positional predictions hold? The sweep
configs/ablations/positional_registered.py, its predictions fixed before it ran, as checks on its
results.

  python scripts/positional_registered_predictions.py \
      --results=docs/results/positional_registered/results.csv \
      --out=docs/results/positional_registered/predictions.md

Trained on lengths up to 20; the measure is the error (1 - accuracy) on each longer test set
(2x: 21-40, 4x: 41-80, 8x: 81-160) at each arm's learning rate chosen on the validation stream,
paired by seed; "a > b" means a errs more, p < 0.05 after Holm over the table's tested checks
(scripts/predictions.py); "near chance": accuracy at most 0.6, the upper end of the 95% interval
included. P1-P4 are the accelerator preset's (scripts/positional_predictions.py) at these lengths.

- D (the design, not a prediction): every arm learns its task on the training lengths (test
  accuracy at least 0.95 in every seed at its chosen rate), so that what it does at longer
  lengths is extrapolation, not underfitting; and every chosen rate lies inside the rates tried.
- P1 (Press et al. 2022): on `order` ALiBi extrapolates: at 4x and 8x it errs less than the
  sinusoidal and the learned encoding.
- P2: on `order` at 8x ALiBi also errs less than RoPE (its distance penalty keeps attention local;
  RoPE's rotation angles at unseen distances are new).
- P3 (the first positional study, Ruoss et al. 2023): on `even_pairs` at 2x RoPE errs less than
  the sinusoidal and the learned encoding.
- P4 (Ruoss et al. 2023): on `even_pairs` no standard encoding generalises to 8x: the sinusoidal,
  learned, RoPE and ALiBi encodings are each near chance.
- P5 (Ruoss et al. 2023, randomized): trained at positions spread over the whole range, the
  randomized encoding errs less than the sinusoidal one at 4x and 8x on both tasks.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import positional_registered as study  # noqa: E402
from experiments import statistics, sweep_report, verdicts  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.positional_predictions import errors, near_chance  # noqa: E402
from scripts.predictions import above, chosen  # noqa: E402

LEARNED = 0.95  # the accuracy on the training lengths every seed of every arm must reach
STANDARD = ("sinusoidal", "learned", "rope", "alibi")


def design(records) -> list[tuple[str, bool, str]]:
  """The design's untested checks: every arm learns the training lengths, every choice inside
  the grid."""
  choices = verdicts.choose(records, sweep_report.measure_of(records))
  checks = [(f"{c.variant} >= {LEARNED:g} in every seed", min(c.metrics["eval_accuracy"]) >= LEARNED,
             f"lowest {min(c.metrics['eval_accuracy']):.4g} of {len(c.metrics['eval_accuracy'])} "
             f"seeds at {c.learning_rate:g}") for c in choices]
  edges = [f"{c.variant} at {c.learning_rate:g}" for c in choices if c.edge]
  checks.append(("every chosen rate inside the rates tried", not edges,
                 "; ".join(edges) or f"all {len(choices)} arms"))
  return checks


def errs_more(error, a: str, b: str, lengths: tuple[int, int]):
  """The check "a > b" on ``error[lengths]`` (errors(), at the test lengths (low, high)), named
  with them."""
  check = above(error[lengths], a, b)
  return dataclasses.replace(check, name=f"{check.name} at {lengths[0]}-{lengths[1]}")


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, test lengths, checks) per prediction."""
  x2, x4, x8 = study.TEST_LENGTHS
  error = {lengths: errors(records, *lengths) for lengths in study.TEST_LENGTHS}
  span = lambda *lengths: " and ".join(f"{low}-{high}" for low, high in lengths)
  return [
      ("D", "training lengths", design(records)),
      ("P1", f"order, {span(x4, x8)}",
       [errs_more(error, f"order-{other}", "order-alibi", lengths) for lengths in (x4, x8)
        for other in ("sinusoidal", "learned")]),
      ("P2", f"order, {span(x8)}", [errs_more(error, "order-rope", "order-alibi", x8)]),
      ("P3", f"even_pairs, {span(x2)}",
       [errs_more(error, f"even_pairs-{other}", "even_pairs-rope", x2)
        for other in ("sinusoidal", "learned")]),
      ("P4", f"even_pairs, {span(x8)}",
       [near_chance(error[x8], f"even_pairs-{name}") for name in STANDARD]),
      ("P5", f"both tasks, {span(x4, x8)}",
       [errs_more(error, f"{task}-sinusoidal", f"{task}-randomized", lengths)
        for task in study.TASKS for lengths in (x4, x8)]),
  ]


def figure(records, directory: str) -> None:
  """accuracy_at_chosen_rates.png: each encoding's test accuracy on the training lengths and on
  each longer test set at its chosen rate, means with 95% bootstrap intervals, a panel per task."""
  sets = [("eval_accuracy", f"1-{study.TRAIN_LENGTH}\n(trained)")] + [
      (f"length_{low}_{high}_accuracy", f"{low}-{high}\n({high // study.TRAIN_LENGTH}x)")
      for low, high in study.TEST_LENGTHS]
  by_set = {column: chosen(records, column) for column, _ in sets}
  fig, axes = plt.subplots(1, len(study.TASKS), figsize=(10, 3.8), sharey=True)
  for axis, task in zip(axes, study.TASKS):
    for i, encoding in enumerate(study.ENCODINGS):
      arm = f"{task}-{encoding}"
      stats = [statistics.mean_interval(list(by_set[column][arm].values()), 0.0, 1.0)
               for column, _ in sets]
      x = [j + 0.05 * (i - 2) for j in range(len(sets))]
      mean = [m for m, _, _ in stats]
      axis.errorbar(x, mean, yerr=[[m - low for m, low, _ in stats],
                                   [high - m for m, _, high in stats]],
                    marker="os^Dv"[i], capsize=3, label=encoding)
    axis.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    axis.set_xticks(range(len(sets)), [label for _, label in sets])
    axis.set_title(task)
    axis.set_xlabel("test lengths")
  axes[0].set_ylabel("test accuracy at the chosen rate")
  axes[-1].legend(fontsize=8, loc="lower left")
  fig.tight_layout()
  fig.savefig(os.path.join(directory, "accuracy_at_chosen_rates.png"), dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "test lengths", figure)
