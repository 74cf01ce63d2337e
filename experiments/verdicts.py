"""A study's verdicts from its records: each variant at the learning rate its validation stream
chose, compared with the declared reference by the declared test, the family corrected by Holm
(experiments/statistics.py). What the comparisons are is fixed by the sweep config before the run
(configs/ablations/__init__.py) and written into every row of results.csv, so that a report made
from the CSV alone makes the same comparisons.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from experiments import statistics
from experiments import workdir as workdir_lib
from experiments.steps import MEASURES

VALIDATION = "validation"  # the extra test set that chooses learning rates
REACHED = {"accuracy": 0.9, "nmse": 0.1}  # "solved": this accuracy, or down to this NMSE
STEPS_TO = "steps_to_threshold"  # per replica: the first evaluation at the threshold (NaN: never)
# The columns of results.csv that say what the study compares (the same in every row, but
# compared_with, which is the row's variant's references joined by ";").
COLUMNS = ("baseline", "compared_with", "test", "primary", "solved_at", "censored_at")


def baseline(sweep) -> str:
  """The sweep config's declared baseline arm; its first variant where it declares none."""
  return sweep.get("baseline") or sweep.variants[0][0]


def comparisons(sweep) -> list[tuple[str, str]]:
  """The (arm, reference) pairs the report tests, declared by the config before any run: its
  ``contrasts``, or else every other variant against its baseline."""
  if sweep.get("contrasts"):
    return [tuple(pair) for pair in sweep.contrasts]
  return [(name, baseline(sweep)) for name, _ in sweep.variants if name != baseline(sweep)]


@dataclasses.dataclass(frozen=True)
class Design:
  """What a study compares, declared before it runs: ``comparisons`` (arm, reference) pairs,
  the ``test`` (statistics.TESTS) on the ``primary`` metric, a seed "solves" the task at
  ``solved_at`` (an accuracy at least, an NMSE at most), and a seed that never does is censored
  at step ``censored_at`` (one evaluation past the last). ``alpha``: the level its family of
  comparisons is tested at after Holm; None for a smoke test, which claims nothing.
  ``effect``: the smallest effect (arm minus reference, the test's units) it must be able to
  show, with ``spread`` the sd of a seed's difference: checked by simulation (statistics.power)."""
  baseline: str
  comparisons: tuple[tuple[str, str], ...]
  test: str
  primary: str
  solved_at: float
  censored_at: float
  alpha: float | None = dataclasses.field(default=None, compare=False)
  effect: float | None = dataclasses.field(default=None, compare=False)
  spread: float = dataclasses.field(default=0.0, compare=False)

  def __post_init__(self):
    if self.test not in statistics.TESTS:
      raise ValueError(f"test must be one of {statistics.TESTS}, got {self.test!r}.")

  @property
  def higher_is_better(self) -> bool:
    return not self.primary.endswith("nmse")

  @classmethod
  def of_sweep(cls, sweep, measure: str) -> "Design":
    """The design a sweep config declares; ``measure``: "accuracy" or "nmse", what the task's
    records measure."""
    train = sweep.train
    return cls(baseline=baseline(sweep), comparisons=tuple(comparisons(sweep)),
               test=sweep.get("test") or "paired_permutation",
               primary=sweep.get("primary") or f"eval_{measure}",
               solved_at=REACHED[measure],
               censored_at=float(train.num_train_steps + train.eval_every_steps),
               alpha=sweep.get("alpha"), effect=sweep.get("effect"),
               spread=sweep.get("spread") or 0.0)

  def plan(self, seeds: int) -> statistics.Plan:
    """This design checked before it runs with ``seeds`` seeds per arm (statistics.plan): the
    smallest Holm-adjusted p its test can give over its family, the seeds that can reach
    ``alpha`` and, for a declared ``effect``, the power by simulation."""
    return statistics.plan(self.test, seeds, len(self.comparisons), alpha=self.alpha,
                           effect=self.effect, spread=self.spread)

  def refusal(self, seeds: int) -> str | None:
    """One line saying why this design cannot show what it must with ``seeds`` seeds per arm
    and the seeds it needs; None when it can (or declares no alpha, or no comparisons).

    >>> design = Design("a", (("b", "a"),) * 7, "paired_permutation", "eval_nmse", 0.1, 1.0, 0.05)
    >>> design.refusal(8)
    'the paired_permutation test over 8 seeds per arm, Holm over 7 comparisons cannot reach p < 0.05 (smallest adjusted p 0.055): it needs 9 seeds per arm; declare num_seeds in the config.'
    >>> design.refusal(9) is None
    True
    """
    if self.alpha is None or not self.comparisons:
      return None
    problem = self.plan(seeds).problem()
    return f"{problem[:-1]}; declare num_seeds in the config." if problem else None

  def columns(self, variant: str) -> dict:
    """This design's COLUMNS for the rows of ``variant``."""
    references = [reference for arm, reference in self.comparisons if arm == variant]
    return {"baseline": self.baseline, "compared_with": ";".join(references),
            "test": self.test, "primary": self.primary, "solved_at": self.solved_at,
            "censored_at": self.censored_at}

  @classmethod
  def of_rows(cls, rows) -> "Design | None":
    """The design written into results.csv rows (dicts), None for a CSV without it."""
    rows = [row for row in rows if row.get("baseline")]
    if not rows:
      return None
    first = rows[0]
    comparisons = tuple(dict.fromkeys(
        (row["variant"], reference) for row in rows
        for reference in str(row["compared_with"]).split(";") if reference))
    return cls(baseline=first["baseline"], comparisons=comparisons, test=first["test"],
               primary=first["primary"], solved_at=float(first["solved_at"]),
               censored_at=float(first["censored_at"]))


@dataclasses.dataclass(frozen=True)
class Chosen:
  """A variant at its chosen learning rate: the metrics of that arm (lists over its seeds), the
  rate, where it sits in the grid ("lowest", "highest" or "" inside it) and the set that chose."""
  variant: str
  learning_rate: float
  metrics: dict
  edge: str
  chosen_on: str
  record: dict


def chosen_on(records) -> str:
  """The test set that picks learning rates: VALIDATION when every record has it, else eval."""
  finished = [r for r in records if r["status"] == "ok"]
  return VALIDATION if finished and all(f"{VALIDATION}_loss" in r["metrics"]
                                        for r in finished) else "eval"


def _by_rate(record) -> dict[float, list[int]]:
  rates = {}
  for index, rate in enumerate(record["metrics"]["learning_rate"]):
    rates.setdefault(float(rate), []).append(index)
  return rates


def _score(metrics, prefix: str, measure: str) -> tuple[float, float]:
  """Higher is better: the mean measure on ``prefix`` (negated for an NMSE), then -loss."""
  sign = 1.0 if MEASURES[measure] else -1.0
  values = np.asarray(metrics[f"{prefix}_{measure}"], np.float64)
  losses = np.asarray(metrics[f"{prefix}_loss"], np.float64)
  if not np.isfinite(values).any():
    return -math.inf, -math.inf
  return sign * float(np.nanmean(values)), -float(np.nanmean(losses))


def choose(records, measure: str) -> list[Chosen]:
  """Each finished variant at the learning rate of its grid with the best mean ``measure`` on
  the validation stream (the test set only for records that have none, and then said so)."""
  prefix, chosen = chosen_on(records), []
  for record in records:
    if record["status"] != "ok":
      continue
    rates = _by_rate(record)
    arms = {rate: {name: [values[i] for i in indices]
                   for name, values in record["metrics"].items()}
            for rate, indices in rates.items()}
    rate = max(arms, key=lambda r: _score(arms[r], prefix, measure))
    edge = ("" if len(rates) < 2 else "lowest" if rate == min(rates)
            else "highest" if rate == max(rates) else "")
    chosen.append(Chosen(record["variant"], rate, arms[rate], edge, prefix, record))
  return chosen


def solved(values, design: Design) -> np.ndarray:
  values = np.asarray(values, np.float64)
  return (values >= design.solved_at) if design.higher_is_better else (
      np.isfinite(values) & (values <= design.solved_at))


# The settings that change what seed s of an arm trains and is tested on: arms that differ in one
# of them (a task length, say) do not share their batches, so their seeds are not pairs.
DATA_SETTINGS = ("task", "task_options", "batch_size")


def same_data(a: Chosen, b: Chosen) -> bool:
  """Whether seed s of ``a`` and of ``b`` saw the same batches: no override of a DATA_SETTINGS
  entry differs between their records (a nested dict from a run, a flat one from results.csv)."""
  def data(chosen):
    flat = workdir_lib.flatten(chosen.record.get("overrides", {}))
    return {k: v for k, v in flat.items() if k.split(".")[0] in DATA_SETTINGS}
  return data(a) == data(b)


def _by_seed(metrics, name) -> dict[int, float]:
  return {int(seed): float(value) for seed, value in zip(metrics["seed"], metrics[name])}


def compare(chosen: list[Chosen], design: Design) -> list[statistics.Comparison]:
  """The design's comparisons between chosen arms, paired by seed where they share all seeds and
  their data (same_data), with Holm's adjusted p over the family."""
  by_name = {c.variant: c for c in chosen}
  results = []
  for arm, reference in design.comparisons:
    if arm not in by_name or reference not in by_name:
      continue  # a variant that failed: nothing to compare
    a, b = by_name[arm].metrics, by_name[reference].metrics
    metric = STEPS_TO if design.test == "time_to_solve" else design.primary
    if metric not in a:
      raise ValueError(f"the test {design.test!r} needs the per-seed column {metric!r}, which "
                       "these records lack; redo the report from the sweep's workdir.")
    a_values, b_values = _by_seed(a, metric), _by_seed(b, metric)
    paired = (design.test != "permutation" and a_values.keys() == b_values.keys()
              and same_data(by_name[arm], by_name[reference]))
    seeds = sorted(a_values)
    x = np.array([a_values[s] for s in seeds])
    y = np.array([b_values[s] for s in (seeds if paired else sorted(b_values))])
    if design.test == "solve_rate":
      results.append(statistics.solve_rate_difference(
          "solved", arm, reference, solved(x, design), solved(y, design)))
    elif design.test == "time_to_solve":
      results.append(statistics.time_to_solve_difference(
          STEPS_TO, arm, reference, x, y, design.censored_at, paired))
    elif paired:
      results.append(statistics.paired_difference(metric, arm, reference, x, y))
    else:
      results.append(statistics.independent_difference(metric, arm, reference, x, y))
  return statistics.adjust(results)


def power_note(design: Design, seeds: int) -> str:
  """One sentence: can this design show an effect at p < 0.05 with ``seeds`` seeds per arm?"""
  family = len(design.comparisons)
  if family == 0:
    return "The study declares no comparisons."
  smallest = statistics.smallest_p(design.test, seeds, family)
  can = "can" if smallest < statistics.SIGNIFICANT else "cannot"
  return (f"With {seeds} seeds per arm and {family} comparisons, the {design.test} test {can} "
          f"reach p < {statistics.SIGNIFICANT:g} after Holm (smallest possible adjusted p "
          f"{smallest:.2g}).")


def verdict(comparison: statistics.Comparison, design: Design) -> str:
  """In words: better, worse, or no difference detected (never "the same")."""
  if not math.isfinite(comparison.p_adjusted) or comparison.p_adjusted >= statistics.SIGNIFICANT:
    return f"no difference detected ({comparison.n} seeds)"
  if comparison.test in ("time_to_solve", "logrank"):
    better = comparison.estimate < 0  # solved sooner
  elif comparison.test == "solve_rate":
    better = comparison.estimate > 0
  else:
    better = (comparison.estimate > 0) == design.higher_is_better
  return "better" if better else "worse"
