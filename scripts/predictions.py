"""The checks that the studies' predictions are written in, on {variant: {seed: value}} (a
measure where lower is better: NMSE, or the error 1 - accuracy), paired by seed (seed s of every
variant saw the same batches in the same order). Each check is (name, held, measured): held is
True, False, or None where it cannot be tested.

- "a > b": a's value is above b's, the paired t-test's p < 0.05;
- "a not above b": not "a > b";
- "a ~ b": a is at most MARGIN above b, the 95% interval's upper end below MARGIN.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import statistics, sweep_report  # noqa: E402

MARGIN = 0.05  # of NMSE (5% of the target's variance) or of error (5 points of accuracy)


def chosen(records, column="eval_nmse", measure=lambda value: value) -> dict[str, dict]:
  """{variant: {seed: measure(column)}} at each variant's chosen learning rate (test NMSE by
  default)."""
  return {variant: {s: measure(v) for s, v in zip(metrics["seed"], metrics[column])}
          for variant, _, metrics, _ in sweep_report.best_learning_rates(records)}


def _pair(values, a, b):
  seeds = sorted(set(values[a]) & set(values[b]))
  return [values[a][s] for s in seeds], [values[b][s] for s in seeds]


def difference(values, a, b) -> tuple[float, float, float, str]:
  """(mean of a - b, half-width of its 95% interval, p, the same as text), paired by seed."""
  mean, half, p, n = statistics.paired(*_pair(values, a, b))
  half = 0.0 if math.isnan(half) else half
  return mean, half, p, (f"{a} - {b} = {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}], "
                         f"p {p:.2g}, {n} seeds")


def above(values, a, b):
  """a above b, significantly (p < 0.05)."""
  mean, _, p, text = difference(values, a, b)
  return f"{a} > {b}", mean > 0 and p < statistics.SIGNIFICANT, text


def not_above(values, a, b):
  name, held, text = above(values, a, b)
  return f"{a} not above {b}", not held, text


def close(values, a, b):
  """a at most MARGIN above b, the interval's upper end included."""
  mean, half, _, text = difference(values, a, b)
  return f"{a} ~ {b} (within {MARGIN:g})", mean + half < MARGIN, text


def mean_of(values, a) -> float:
  """a's mean over its seeds."""
  return float(np.nanmean(list(values[a].values())))


def table(rows, setting="task") -> str:
  """The checks as a markdown table; ``setting`` names the second column (what each row's
  second entry is)."""
  lines = [f"| prediction | {setting} | check | measured | check holds | prediction held |",
           "|---|---|---|---|---|---|"]
  for number, task, checks in rows:
    held = all(check[1] for check in checks)
    for i, (name, check_held, text) in enumerate(checks):
      verdict = {True: "yes", False: "no", None: "untestable"}[check_held]
      lines.append(f"| {number if i == 0 else ''} | {task if i == 0 else ''} | {name} | {text} | "
                   f"{verdict} | "
                   f"{('**yes**' if held else '**no**') if i == 0 else ''} |")
  return "\n".join(lines) + "\n"


def main(doc: str, predictions, setting: str) -> None:
  """The command line of a study's predictions script: ``--results`` (the sweep's results.csv)
  -> ``predictions(records)`` as a table, printed and with ``--out`` written (markdown)."""
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--results", required=True, help="results.csv of the accelerator sweep")
  parser.add_argument("--out", default=None, help="write the table here (markdown)")
  args = parser.parse_args()
  text = table(predictions(sweep_report.records_from_csv(args.results)), setting=setting)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  print(text)
