"""The checks that the studies' predictions are written in, on {variant: {seed: value}} (a
measure where lower is better: NMSE, or the error 1 - accuracy), paired by seed (seed s of every
variant saw the same batches in the same order) unless a check says ``paired=False`` (arms that
see different data, such as different task lengths). A check is (name, held, measured): held is
True, False, or None where it cannot be tested. The tested checks of one table are one family:
their p values are corrected together (Holm) before any is called held.

- "a > b": a's value is above b's, the exact sign-flip test's (unpaired: the permutation test's)
  Holm-adjusted p < 0.05;
- "a not above b": not "a > b";
- "a ~ b": a within MARGIN of b, shown by two one-sided tests (TOST) at Holm-adjusted p < 0.05;
  with few seeds it cannot be shown, and the table says so;
- "largest drop": the largest fall of the mean along a chain of arms is at the given step.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import statistics, sweep_report, verdicts  # noqa: E402

MARGIN = 0.05  # of NMSE (5% of the target's variance) or of error (5 points of accuracy)


@dataclasses.dataclass(frozen=True)
class Tested:
  """A check decided by a test's p after Holm over the table: ``held(p_adjusted)``."""
  name: str
  text: str
  p: float
  held: Callable[[float], bool]


def chosen(records, column="eval_nmse", measure=lambda value: value) -> dict[str, dict]:
  """{variant: {seed: measure(column)}} at each variant's learning rate chosen on the validation
  stream (test NMSE by default)."""
  return {c.variant: {s: measure(v) for s, v in zip(c.metrics["seed"], c.metrics[column])}
          for c in verdicts.choose(records, sweep_report.measure_of(records))}


def _pair(values, a, b):
  seeds = sorted(set(values[a]) & set(values[b]))
  return [values[a][s] for s in seeds], [values[b][s] for s in seeds]


def difference(values, a, b, paired: bool = True) -> statistics.Comparison:
  """a - b paired by seed (mean, bootstrap interval, exact sign-flip p) or, with ``paired``
  False, between independent seeds (difference of means, permutation p)."""
  if paired:
    return statistics.paired_difference("", a, b, *_pair(values, a, b))
  return statistics.independent_difference("", a, b, list(values[a].values()),
                                           list(values[b].values()))


def _text(c: statistics.Comparison) -> str:
  return (f"{c.arm} - {c.baseline} = {c.estimate:+.3g} [{c.low:+.3g}, {c.high:+.3g}], "
          f"p {c.p:.2g}, {c.n} seeds")


def above(values, a, b, paired: bool = True) -> Tested:
  """a above b, significantly after Holm."""
  c = difference(values, a, b, paired)
  return Tested(f"{a} > {b}", _text(c), c.p,
                lambda q: c.estimate > 0 and q < statistics.SIGNIFICANT)


def not_above(values, a, b) -> Tested:
  c = difference(values, a, b)
  return Tested(f"{a} not above {b}", _text(c), c.p,
                lambda q: not (c.estimate > 0 and q < statistics.SIGNIFICANT))


def close(values, a, b, margin: float = MARGIN) -> Tested:
  """a within ``margin`` of b, by TOST."""
  c = difference(values, a, b)
  p = statistics.equivalence(*_pair(values, a, b), margin)
  return Tested(f"{a} ~ {b} (within {margin:g})", _text(c) + f"; TOST p {p:.2g}", p,
                lambda q: q < statistics.SIGNIFICANT)


def mean_of(values, a) -> float:
  """a's mean over its seeds."""
  return float(np.nanmean(list(values[a].values())))


def largest_drop(values, chain, at: int):
  """Whether the largest fall of the mean along ``chain`` (arms in order) is from chain[at] to
  chain[at + 1]: an untested check (name, held, measured)."""
  means = [mean_of(values, v) for v in chain]
  drops = [means[i] - means[i + 1] for i in range(len(chain) - 1)]
  return (f"largest drop {chain[at]} -> {chain[at + 1]}", int(np.argmax(drops)) == at,
          "means " + ", ".join(f"{v} {m:.3g}" for v, m in zip(chain, means)))


def decide(rows) -> list[tuple[str, str, list[tuple[str, bool | None, str]]]]:
  """The rows with every check as (name, held, measured): the tested ones decided after Holm's
  correction over all of them."""
  tested = [check for _, _, checks in rows for check in checks if isinstance(check, Tested)]
  adjusted = statistics.adjust(statistics.Comparison("", "", "", 0, 0, 0, 0, check.p, "")
                               for check in tested)
  holm = {id(check): c.p_adjusted for check, c in zip(tested, adjusted)}
  decided = []
  for number, task, checks in rows:
    out = []
    for check in checks:
      if isinstance(check, Tested):
        q = holm[id(check)]
        out.append((check.name, None if math.isnan(q) else check.held(q),
                    f"{check.text}; Holm {q:.2g}"))
      else:
        out.append(check)
    decided.append((number, task, out))
  return decided


def held(rows) -> dict[str, bool]:
  """{prediction: whether every one of its checks held}, after Holm."""
  return {number: all(check[1] for check in checks) for number, _, checks in decide(rows)}


def table(rows, setting="task") -> str:
  """The checks as a markdown table (decide); ``setting`` names the second column (what each
  row's second entry is)."""
  lines = [f"| prediction | {setting} | check | measured | check holds | prediction held |",
           "|---|---|---|---|---|---|"]
  for number, task, checks in decide(rows):
    held_all = all(check[1] for check in checks)
    for i, (name, check_held, text) in enumerate(checks):
      verdict = {True: "yes", False: "no", None: "untestable"}[check_held]
      lines.append(f"| {number if i == 0 else ''} | {task if i == 0 else ''} | {name} | {text} | "
                   f"{verdict} | "
                   f"{('**yes**' if held_all else '**no**') if i == 0 else ''} |")
  return "\n".join(lines) + "\n"


def main(doc: str, predictions, setting: str, figure=None) -> None:
  """The command line of a study's predictions script: ``--results`` (the sweep's results.csv)
  -> ``predictions(records)`` as a table, printed and with ``--out`` written (markdown), and
  then ``figure(records, directory of --out)`` if given."""
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--results", required=True, help="results.csv of the accelerator sweep")
  parser.add_argument("--out", default=None, help="write the table here (markdown)")
  args = parser.parse_args()
  records = sweep_report.records_from_csv(args.results)
  text = table(predictions(records), setting=setting)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
    if figure is not None:
      figure(records, os.path.dirname(os.path.abspath(args.out)))
  print(text)
