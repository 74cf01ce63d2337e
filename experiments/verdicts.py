"""A study's verdicts from its records: each variant at the learning rate its validation stream
chose for the outcome measured (:func:`choose`), compared with the declared reference by the
declared test, the family corrected by Holm (experiments/statistics.py, :func:`compare`), and
every comparison again at a matched rate, the reference's (:func:`compare_matched`, outside the
family). What the comparisons are is fixed by the sweep config before the run
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
# per replica: the same on the validation stream, which chooses a time-to-threshold study's rates
VALIDATION_STEPS_TO = f"{VALIDATION}_{STEPS_TO}"
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
    statistics.check_test(self.test)

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
  rate, where it sits in the grid ("lowest", "highest" or "" inside it), the set that chose and
  what it was chosen for: the measure's final value, or TIME_TO_THRESHOLD (the validation
  stream's censored time-to-threshold)."""
  variant: str
  learning_rate: float
  metrics: dict
  edge: str
  chosen_on: str
  record: dict
  chosen_for: str = ""

  def at(self, rate: float) -> "Chosen | None":
    """This variant at another ``rate`` of its grid (None where the grid lacks it)."""
    indices = by_rate(self.record).get(float(rate))
    if indices is None:
      return None
    metrics = {name: [values[i] for i in indices]
               for name, values in self.record["metrics"].items()}
    return dataclasses.replace(self, learning_rate=float(rate), metrics=metrics, edge="")


TIME_TO_THRESHOLD = "time to threshold"


def chosen_on(records) -> str:
  """The test set that picks learning rates: VALIDATION when every record has it, else eval."""
  finished = [r for r in records if r["status"] == "ok"]
  return VALIDATION if finished and all(f"{VALIDATION}_loss" in r["metrics"]
                                        for r in finished) else "eval"


def by_rate(record) -> dict[float, list[int]]:
  rates = {}
  for index, rate in enumerate(record["metrics"]["learning_rate"]):
    rates.setdefault(float(rate), []).append(index)
  return rates


def score(metrics, prefix: str, measure: str) -> tuple[float, float]:
  """Higher is better: the mean measure on ``prefix`` (negated for an NMSE), then -loss."""
  sign = 1.0 if MEASURES[measure] else -1.0
  values = np.asarray(metrics[f"{prefix}_{measure}"], np.float64)
  losses = np.asarray(metrics[f"{prefix}_loss"], np.float64)
  if not np.isfinite(values).any():
    return -math.inf, -math.inf
  return sign * float(np.nanmean(values)), -float(np.nanmean(losses))


def _time_score(metrics, design: "Design") -> float:
  """Higher is better: minus the mean validation time-to-threshold, a seed that never reached it
  counted at the design's censoring step."""
  return -float(np.mean(statistics.restricted_times(metrics[VALIDATION_STEPS_TO],
                                                    design.censored_at)))


def for_time(records, design: "Design | None") -> bool:
  """Whether rates are chosen on the validation time-to-threshold: the design's test is
  time_to_solve and every finished record has the column (records from before it: no)."""
  finished = [r for r in records if r["status"] == "ok"]
  return (design is not None and design.test == "time_to_solve" and bool(finished)
          and all(VALIDATION_STEPS_TO in r["metrics"] for r in finished))


def _primary_stream(records, design: "Design | None", measure: str) -> str | None:
  """The validation stream's twin of the test set a ``design``'s primary measure is read on
  ("validation_length_41_80" for "length_41_80_accuracy") where every finished record has it."""
  if design is None or not design.primary.endswith(f"_{measure}") or (
      design.primary == f"eval_{measure}"):
    return None
  column = f"{VALIDATION}_{design.primary}"
  finished = [r for r in records if r["status"] == "ok"]
  return (column.removesuffix(f"_{measure}") if finished and
          all(column in r["metrics"] for r in finished) else None)


def choose(records, measure: str, design: "Design | None" = None) -> list[Chosen]:
  """Each finished variant at the learning rate of its grid that the validation stream scores
  best (the test set only for records that have none, and then said so): for a ``design`` whose
  test is time_to_solve, the shortest mean censored time-to-threshold (VALIDATION_STEPS_TO; ties
  broken by the final measure), else the best mean final ``measure`` on the validation stream's
  twin of the primary's test set where the records have one (``length_41_80`` on another data
  seed: configs.ablations.validation_streams), else on the validation stream."""
  on, chosen = chosen_on(records), []
  for record in records:
    if record["status"] != "ok":
      continue
    # a record read from a results.csv carries its sweep's design (experiments.findings.read)
    own = design if design is not None else record.get("design")
    timed = on == VALIDATION and for_time([record], own)
    prefix = on if timed or on != VALIDATION else (_primary_stream([record], own, measure) or on)
    rates = by_rate(record)
    arms = {rate: {name: [values[i] for i in indices]
                   for name, values in record["metrics"].items()}
            for rate, indices in rates.items()}
    rank = ((lambda r: (_time_score(arms[r], own), *score(arms[r], prefix, measure)))
            if timed else (lambda r: score(arms[r], prefix, measure)))
    rate = max(arms, key=rank)
    edge = ("" if len(rates) < 2 else "lowest" if rate == min(rates)
            else "highest" if rate == max(rates) else "")
    chosen.append(Chosen(record["variant"], rate, arms[rate], edge, prefix, record,
                         TIME_TO_THRESHOLD if timed else measure))
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


def _compare(a: Chosen, b: Chosen, design: Design) -> statistics.Comparison:
  """``a`` against ``b`` by the design's test, paired by seed where they share all seeds and
  their data (same_data)."""
  metric = STEPS_TO if design.test == "time_to_solve" else design.primary
  if metric not in a.metrics or metric not in b.metrics:
    raise ValueError(f"the test {design.test!r} needs the per-seed column {metric!r}, which "
                     "these records lack; redo the report from the sweep's workdir.")
  a_values, b_values = _by_seed(a.metrics, metric), _by_seed(b.metrics, metric)
  paired = (design.test != "permutation" and a_values.keys() == b_values.keys()
            and same_data(a, b))
  seeds = sorted(a_values)
  x = np.array([a_values[s] for s in seeds])
  y = np.array([b_values[s] for s in (seeds if paired else sorted(b_values))])
  if design.test == "solve_rate":
    return statistics.solve_rate_difference("solved", a.variant, b.variant, solved(x, design),
                                            solved(y, design))
  if design.test == "time_to_solve":
    return statistics.time_to_solve_difference(STEPS_TO, a.variant, b.variant, x, y,
                                               design.censored_at, paired)
  lower, upper = statistics.measure_range(metric)
  test = statistics.paired_difference if paired else statistics.independent_difference
  return test(metric, a.variant, b.variant, x, y, lower=lower, upper=upper)


def _pairs_of(chosen: list[Chosen], design: Design):
  by_name = {c.variant: c for c in chosen}
  return [(by_name[arm], by_name[reference]) for arm, reference in design.comparisons
          if arm in by_name and reference in by_name]  # a variant that failed: nothing to compare


def compare(chosen: list[Chosen], design: Design) -> list[statistics.Comparison]:
  """The design's comparisons between arms each at its chosen rate (``rate`` "chosen"), paired
  by seed where they share all seeds and their data (same_data), with Holm's adjusted p over
  this family, the study's primary one."""
  return statistics.adjust(_compare(a, b, design) for a, b in _pairs_of(chosen, design))


def compare_matched(chosen: list[Chosen], design: Design) -> list[statistics.Comparison]:
  """The design's comparisons again at a matched rate: the arm at the rate its reference chose,
  where the arm's grid has it (``rate`` "matched"; none where it lacks it). Secondary: outside
  the Holm family (``p_adjusted`` NaN), so a verdict on one says its p is unadjusted."""
  rows = []
  for a, b in _pairs_of(chosen, design):
    matched = a.at(b.learning_rate)
    if matched is not None:
      rows.append(dataclasses.replace(_compare(matched, b, design), rate=statistics.MATCHED))
  return rows


def compare_both(chosen: list[Chosen], design: Design) -> list[statistics.Comparison]:
  """The rows of comparisons.csv: :func:`compare` (the Holm family), then
  :func:`compare_matched`."""
  return compare(chosen, design) + compare_matched(chosen, design)


def power_note(design: Design, seeds: int) -> str:
  """One sentence: can this design show an effect at p < 0.05 with ``seeds`` seeds per arm?"""
  family = len(design.comparisons)
  if family == 0:
    return "The study declares no comparisons."
  smallest = statistics.smallest_p(design.test, seeds, family)
  can = "can" if smallest < statistics.SIGNIFICANT else "cannot"
  comparisons = "1 comparison" if family == 1 else f"{family} comparisons"
  return (f"With {seeds} seeds per arm and {comparisons}, the {design.test} test {can} "
          f"reach p < {statistics.SIGNIFICANT:g} after Holm (smallest possible adjusted p "
          f"{smallest:.2g}).")


def verdict(comparison: statistics.Comparison, design: Design) -> str:
  """In words, never stronger than the row's test: "better" or "worse" only on a p below
  SIGNIFICANT (Holm's where the row is in the family; a row outside it, p_adjusted NaN, says
  "(p unadjusted)"), else "no difference detected (n seeds)"; "same (within +-margin)" only on a
  passing equivalence test, else "equivalence not shown (n seeds)"."""
  p = comparison.decisive_p
  shown = math.isfinite(p) and p < statistics.SIGNIFICANT
  unadjusted = " (p unadjusted)" if not math.isfinite(comparison.p_adjusted) and shown else ""
  if comparison.is_equivalence:
    return (f"same (within ±{comparison.margin:g}){unadjusted}" if shown
            else f"equivalence not shown ({comparison.n} seeds)")
  if not shown:
    return f"no difference detected ({comparison.n} seeds)"
  return ("better" if _better(comparison, design) else "worse") + unadjusted


def _better(comparison: statistics.Comparison, design: Design) -> bool:
  if comparison.test in ("time_to_solve", "logrank"):
    return comparison.estimate < 0  # solved sooner
  if comparison.test == "solve_rate":
    return comparison.estimate > 0
  return (comparison.estimate > 0) == design.higher_is_better
