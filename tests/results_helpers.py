"""Shared by the study tests: a sweep's results.csv written from rows of made-up measures, and
the records the report reads back from it."""

import csv

from experiments import sweep_report


def write_results(path, rows):
  """A results.csv of ``rows`` (variant, seed, learning rate, setting, {column: value}); the
  records read back from it."""
  columns = list(rows[0][4])
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["variant", "seed", "learning_rate", "weight_decay", "warmup_steps", "status",
                     "diverged_at", "setting"] + columns)
    for variant, seed, lr, setting, values in rows:
      writer.writerow([variant, seed, lr, 0.01, 60, "ok", 0, setting]
                      + [values[c] for c in columns])
  return sweep_report.records_from_csv(path)


def accuracies(**by_set):
  """{<set>_accuracy: a, <set>_loss: 1 - a} for each test set's accuracy a."""
  return {f"{name}_{kind}": value for name, a in by_set.items()
          for kind, value in (("accuracy", a), ("loss", 1 - a))}
