"""A study's predictions, declared as data in its config, evaluated on its results.

  python -m experiments.findings --config=configs/ablations/scaling_init.py \
      --results=docs/results/scaling_init/results.csv \
      --out=docs/results/scaling_init/predictions.md
  python -m experiments.findings --config=configs/ablations/heads_binding.py:multi_retrieval \
      --results=multi_retrieval=docs/results/heads_binding/multi_retrieval/results.csv \
      --results=farthest_point=docs/results/heads_binding/farthest_point/results.csv \
      --out=docs/results/heads_binding/predictions.md

A config module declares ``predictions(mode)``: a dict of plain data, fixed before the study
runs,

- ``setting``: the words of the table's second column (what each prediction's setting is);
- ``measures``: name -> how {arm: {seed: value}} is read from the records (``Measure``'s
  fields: the column, read as a value, an error 1 - value, or steps censored at a horizon; at
  each arm's learning rate chosen on the validation stream or at a fixed ``rate``; from which
  results file; with ``differences``, arms that are per-seed differences of two arms; with
  ``offsets``, constants subtracted per arm);
- ``predictions``: (name, setting, checks) triples; a check is (kind, *arguments, options) with
  the kind one of ``KINDS`` and options (a dict, may be left out) such as ``measure``, ``paired``
  (False: arms that saw different data) or ``at`` (words after the check's name);
- optionally ``alpha`` (0.05) and ``figure`` (a figure of experiments/study_figures.py).

One question is read in one family. A check that asks what a row of the study's primary family
asks (the comparisons its sweep config declares, the rows of its comparisons.csv at the chosen
rates: the same two arms, the same measure) takes that row: its estimate, interval, p and Holm p
over the study's family, so that the page's comparisons table and its predictions cannot
disagree. The other tested checks are corrected together (Holm, over those checks and the
declared null checks no test could decide, which count at p = 1: the family is what was declared
before the run) before any is called held. A prediction holds when all its checks do; it is not
tested when none fails and one could not be tested. A check naming an arm the results given do
not hold (a study run in part, some of its sweeps) is "not run" and, where run it would be
tested in that Holm family (HOLM_KINDS), counts there at p = 1, as an undecidable null check
does: running less never loosens the rest. The kinds:

- "above" a b: a's value above b's, the exact sign-flip test's (unpaired: the permutation
  test's) Holm-adjusted p < alpha;
- "not_above" a b: a null prediction ("no worse") declared without a margin: it never holds (a
  margin cannot be given after the run: "not tested for equivalence (no margin declared before
  the run)"), and it fails where a is shown above b, tested as "above" is;
- "within" a b margin: a within ``margin`` of b, shown by two one-sided tests (TOST);
- on times to a threshold (a measure read as "steps"), the seeds in which neither arm reaches
  it carry no difference: "within" leaves them out (counting them as 0 would pull toward
  "within"), and a check whose arms reach it in no seed is untestable, at p = 1 in the family
  it would have been decided in;
- "recovers_half" a worse better: a's mean at most halfway from the worse arm's to the better's
  (untestable unless worse is above better at raw p < alpha); "short_of_half": the opposite;
- "largest_drop" chain at: the largest fall of the mean along the arms ``chain`` is at ``at``;
- "below" / "above_level" a level: the 95% interval of a's mean wholly below / above level
  (option ``every_seed``: every seed's value below / above it);
- "near_chance" a level: the interval of a's mean accuracy at most level;
- "reaches" a level: a's test accuracy at least ``level`` in every seed at its chosen rate;
- "rates_inside": every arm's chosen learning rate lies inside the rates it tried;
- "rate_transfers" arms transfers: whether the best learning rate moves along ``arms`` (one
  setting each, e.g. d_k 16, 64, 256): per seed, the index in the grid of the rate with the best
  validation accuracy (ties: the lower validation loss); Friedman's test across the arms, seeds as
  blocks, at alpha unadjusted (option ``steps``, 1: the most the mean index may move from the
  first arm to the last). With ``transfers`` True it holds where the test does not reject and the
  mean index moves at most ``steps`` (a declared rule, not an equivalence test); with False,
  where the test rejects.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from typing import Callable

import numpy as np

from experiments import report_tables, statistics, verdicts
from experiments.measures import RESULTS, Measure

NOT_TESTED = "not tested for equivalence (no margin declared before the run)"
NOT_RUN = "not run: no results of {} in the files given"
STUDY_FAMILY = "in the study's family"
OTHER_CHECKS = "over the other checks"


@dataclasses.dataclass(frozen=True)
class Check:
  """A check decided by its p after Holm: ``held(p_adjusted)``; ``p_adjusted`` given already
  where the check is a row of the study's primary family (None: Holm over the other checks)."""
  name: str
  text: str
  p: float
  held: Callable[[float], bool | None]
  p_adjusted: float | None = None
  null: bool = False  # a declared null check: at best not tested, refuted where held is False
  unadjusted: bool = False  # declared at alpha without Holm's correction (its text says so)


@dataclasses.dataclass(frozen=True)
class Study:
  """What a check reads: the records per source, their chosen arms, the measures, alpha;
  ``given``: {measure: {arm: {seed: value}}} read already, where records are not at hand;
  ``family``: {source: {(arm, reference): Comparison}}, the study's primary family per results
  file (its comparisons at the chosen rates, Holm over them)."""
  records: dict
  measures: dict
  alpha: float
  given: dict | None = None
  family: dict = dataclasses.field(default_factory=dict)

  def in_family(self, options, a, b) -> tuple[statistics.Comparison, int] | None:
    """The row of the primary family that asks whether a differs from b (and +1, or -1 where
    the row is b minus a), or None where the family has no such row on this check's measure."""
    measure = self.measures[options.get("measure", "primary")]
    rows = self.family.get(measure.source, {})
    if (measure.rate is not None or measure.read == "error" or self.given is not None
        or measure.offsets or {a, b} & set(dict(measure.differences))):
      return None
    for pair, sign in (((a, b), 1), ((b, a), -1)):
      row = rows.get(pair)
      if row is not None and row.metric == measure.column:
        return row, sign
    return None

  def values(self, options) -> dict[str, dict[int, float]]:
    name = options.get("measure", "primary")
    measure = self.measures[name]
    if self.given is not None:
      return measure.with_differences(self.given[name])
    return measure.of(self.records[measure.source])

  def has(self, arm: str) -> bool:
    """Whether any record (or value read already) is of ``arm``, or of both arms of a
    difference a measure declares under that name."""
    for measure in self.measures.values():
      if arm in dict(measure.differences):
        return all(map(self.has, dict(measure.differences)[arm]))
    if self.given is not None:
      return any(arm in values for values in self.given.values())
    return any(r["variant"] == arm for records in self.records.values() for r in records)

  def chosen(self, options) -> list[verdicts.Chosen]:
    records = self.records[self.measures[options.get("measure", "primary")].source]
    return verdicts.choose(records, report_tables.measure_of(records))


def _pair(values, a, b):
  seeds = sorted(set(values[a]) & set(values[b]))
  return [values[a][s] for s in seeds], [values[b][s] for s in seeds]


def difference(values, a, b, paired: bool = True) -> statistics.Comparison:
  """a - b paired by seed (mean, 95% t interval, exact sign-flip p) or, with ``paired``
  False, between independent seeds (difference of means, permutation p)."""
  if paired:
    return statistics.paired_difference("", a, b, *_pair(values, a, b))
  return statistics.independent_difference("", a, b, list(values[a].values()),
                                           list(values[b].values()))


def _text(c: statistics.Comparison) -> str:
  return (f"{c.arm} - {c.baseline} = {c.estimate:+.3g} [{c.low:+.3g}, {c.high:+.3g}], "
          f"p {c.p:.2g}, {c.n} seeds")


def _family_text(row: statistics.Comparison, sign: int, a: str, b: str) -> str:
  low, high = sorted((sign * row.low, sign * row.high))
  return (f"{a} - {b} = {sign * row.estimate:+.3g} [{low:+.3g}, {high:+.3g}], "
          f"p {row.p:.2g}, {row.n} seeds ({row.test.replace('_', ' ')})")


def _named(options, name: str) -> str:
  return f"{name} at {options['at']}" if "at" in options else name


def _censored(study, options, values, a, b) -> tuple[set[int], str | None]:
  """(the seeds in which neither arm reaches the threshold of a times-to-threshold measure, and
  why the check cannot be decided where that is every seed). Both times sit at the censoring
  horizon there, which bounds them from below and compares nothing: a difference of 0 is no
  evidence of "same" or of "no faster"."""
  measure = study.measures[options.get("measure", "primary")]
  if measure.read != "steps":
    return set(), None
  paired = set(values[a]) & set(values[b])
  both = {s for s in paired if min(values[a][s], values[b][s]) >= measure.censored_at}
  return both, (f"neither arm reaches the threshold in any seed (every time censored at "
                f"{measure.censored_at:g}): not measurable" if both == paired else None)


def above(study, options, a, b) -> Check:
  name = _named(options, f"{a} > {b}")
  values = study.values(options)
  _, unmeasured = _censored(study, options, values, a, b)
  found = study.in_family(options, a, b)
  if found is not None:
    row, sign = found
    if unmeasured:  # untestable, its row still in the study's family
      return Check(name, unmeasured, row.p, lambda q: None, row.p_adjusted)
    return Check(name, _family_text(row, sign, a, b), row.p,
                 lambda q: sign * row.estimate > 0 and q < study.alpha, row.p_adjusted)
  if unmeasured:
    return Check(name, unmeasured, 1.0, lambda q: None)
  c = difference(values, a, b, options.get("paired", True))
  return Check(name, _text(c), c.p, lambda q: c.estimate > 0 and q < study.alpha)


def not_above(study, options, a, b) -> Check:
  """Tested among the other checks (never taking a row of the study's family), so that the
  family it was declared in keeps its size whether or not the check can fail."""
  c = difference(study.values(options), a, b, options.get("paired", True))
  return Check(_named(options, f"{a} not above {b}"), _text(c), c.p,
               lambda q: False if c.estimate > 0 and q < study.alpha else None, null=True)


def within(study, options, a, b, margin) -> Check:
  """TOST on the seeds paired; seeds in which neither arm reaches a threshold (times censored in
  both) carry no difference and are left out, since counting them as 0 would pull toward
  "within"."""
  name = _named(options, f"{a} ~ {b} (within {margin:g})")
  values = study.values(options)
  left, unmeasured = _censored(study, options, values, a, b)
  if unmeasured:
    return Check(name, unmeasured, 1.0, lambda q: None)
  values = {arm: {s: v for s, v in values[arm].items() if s not in left} for arm in (a, b)}
  c = difference(values, a, b)
  p = statistics.equivalence(*_pair(values, a, b), margin)
  note = (f"; {len(left)} seed(s) where neither arm reaches the threshold left out" if left
          else "")
  return Check(name, _text(c) + f"; TOST p {p:.2g}" + note, p, lambda q: q < study.alpha)


def _mean(values, a) -> float:
  return float(np.nanmean(list(values[a].values())))


def largest_drop(study, options, chain, at):
  values = study.values(options)
  means = [_mean(values, v) for v in chain]
  drops = [means[i] - means[i + 1] for i in range(len(chain) - 1)]
  return (f"largest drop {chain[at]} -> {chain[at + 1]}", int(np.argmax(drops)) == at,
          "means " + ", ".join(f"{v} {m:.3g}" for v, m in zip(chain, means)))


def recovers_half(study, options, a, worse, better):
  values = study.values(options)
  gap = _mean(values, worse) - _mean(values, better)
  recovered = (_mean(values, worse) - _mean(values, a)) / gap if gap else math.nan
  name = f"{a} recovers half of {worse} -> {better}"
  gap_test = difference(values, worse, better)
  if not (gap_test.estimate > 0 and gap_test.p < study.alpha):
    return name, None, (f"no significant gap: {worse} - {better} = {gap_test.estimate:+.3g}, "
                        f"p {gap_test.p:.2g}, {gap_test.n} seeds")
  return (name, recovered >= 0.5,
          f"recovers {recovered:.0%} of a gap of {gap:.3f} NMSE ({a} {_mean(values, a):.3f}, "
          f"{worse} {_mean(values, worse):.3f}, {better} {_mean(values, better):.3f})")


def short_of_half(study, options, a, worse, better):
  _, held, text = recovers_half(study, options, a, worse, better)
  return (f"{a} recovers less than half of {worse} -> {better}",
          None if held is None else not held, text)


def _beyond(study, options, a, level, side):
  values = list(study.values(options)[a].values())
  mean, low, high = statistics.mean_interval(values, 0.0)
  words = f" {options['words']}" if "words" in options else ""
  if options.get("every_seed"):  # every seed's value, not the mean's interval
    worst = max(values) if side == "below" else min(values)
    return (f"{a} {side} {level:g} in every seed",
            worst < level if side == "below" else worst > level,
            f"{a}{words} {'highest' if side == 'below' else 'lowest'} {worst:.3g}, mean "
            f"{mean:.3g}, {len(values)} seeds")
  return (f"{a} {side} {level:g}", high < level if side == "below" else low > level,
          f"{a}{words} {mean:.3g} [{low:.3g}, {high:.3g}], {len(values)} seeds")


def below(study, options, a, level):
  return _beyond(study, options, a, level, "below")


def above_level(study, options, a, level):
  return _beyond(study, options, a, level, "above")


def near_chance(study, options, a, level):
  accuracy = list(study.values(options)[a].values())
  mean, low, high = statistics.mean_interval(accuracy, 0.0, 1.0)
  return (f"{a} near chance (accuracy <= {level:g})", high <= level,
          f"{a} accuracy {mean:.3f} [{low:.3f}, {high:.3f}], {len(accuracy)} seeds")


def reaches(study, options, a, level):
  (arm,) = [c for c in study.chosen(options) if c.variant == a]
  accuracy = arm.metrics["eval_accuracy"]
  rate = f" at {arm.learning_rate:g}" if options.get("rate_in_text") else ""
  return (f"{a} >= {level:g} in every seed", min(accuracy) >= level,
          f"lowest {min(accuracy):.4g} of {len(accuracy)} seeds{rate}")


def rates_inside(study, options):
  choices = study.chosen(options)
  edges = [f"{c.variant} at {c.learning_rate:g}" for c in choices if c.edge]
  return ("every chosen rate inside the rates tried", not edges,
          "; ".join(edges) or f"all {len(choices)} arms")


def _runs(record) -> dict[tuple[int, float], int]:
  """{(seed, learning rate): the row of ``record``'s metrics} of its finished runs."""
  seeds = record["metrics"]["seed"]
  return {(int(seeds[i]), rate): i for rate, rows in verdicts.by_rate(record).items()
          for i in rows}


def rate_transfers(study, options, arms, transfers):
  records = study.records[study.measures[options.get("measure", "primary")].source]
  runs = {r["variant"]: _runs(r) for r in records if r["variant"] in arms}
  by_arm = {r["variant"]: r for r in records if r["variant"] in arms}
  grid = sorted({rate for a in arms for _, rate in runs[a]})
  every_seed = [{s for s, _ in runs[a]} for a in arms]
  seeds = sorted(set.intersection(*every_seed))
  name = f"best rate {'transfers' if transfers else 'moves'} along {', '.join(arms)}"
  lacking = [f"{a} at seed {s}, rate {r:g}" for a in arms for s in seeds for r in grid
             if (s, r) not in runs[a]]
  if len(grid) < 2 or len(arms) < 3 or lacking:
    why = (f"{len(grid)} rate(s) tried" if len(grid) < 2 else f"{len(arms)} settings, "
           "Friedman's test needs 3" if len(arms) < 3 else
           f"not every arm ran every rate ({lacking[0]} missing: a part not merged?)")
    return Check(name, f"{why}: not measurable", 1.0, lambda q: None, p_adjusted=1.0,
                 unadjusted=True)
  on = verdicts.chosen_on(list(by_arm.values()))  # validation, else eval (said in the text)

  def best(arm, seed) -> int:  # index in the grid of the best accuracy (ties: lower loss)
    m, rows = by_arm[arm]["metrics"], runs[arm]
    return max(range(len(grid)), key=lambda k: verdicts.score(
        {column: [m[column][rows[seed, grid[k]]]] for column in (f"{on}_accuracy", f"{on}_loss")},
        on, "accuracy"))

  index = np.array([[best(a, s) for a in arms] for s in seeds])  # [seeds, arms]
  p = statistics.friedman(index)
  means = index.mean(axis=0)
  steps = options.get("steps", 1)
  moved = abs(means[-1] - means[0])
  dropped = max(len(s) for s in every_seed) - len(seeds)
  text = (f"best-rate index on the {on} stream (mean over {len(seeds)} seeds"
          + (f", {dropped} not in every arm left out" if dropped else "") + ") "
          + ", ".join(f"{a} {m:.2g}" for a, m in zip(arms, means))
          + f"; moved {moved:.2g} (at most {steps:g}); Friedman p {p:.2g}, at "
          f"{study.alpha:g} unadjusted, as declared")
  held_ = ((lambda q: bool(q >= study.alpha and moved <= steps)) if transfers
           else (lambda q: bool(q < study.alpha)))
  return Check(name, text, p, held_, p_adjusted=p, unadjusted=True)


# The kinds decided by a p in the family of the other checks (the rest read means or designs,
# or, as rate_transfers, are declared at alpha unadjusted)
HOLM_KINDS = ("above", "not_above", "within")
KINDS = {"above": above, "not_above": not_above, "within": within,
         "largest_drop": largest_drop, "recovers_half": recovers_half,
         "short_of_half": short_of_half, "below": below, "above_level": above_level,
         "near_chance": near_chance, "reaches": reaches, "rates_inside": rates_inside,
         "rate_transfers": rate_transfers}


def _arms(arguments) -> list[str]:
  """The arms a check's arguments name (strings, also inside a chain)."""
  names = []
  for argument in arguments:
    names += [argument] if isinstance(argument, str) else (
        _arms(argument) if isinstance(argument, (tuple, list)) else [])
  return names


def _check(study, check):
  kind, *arguments = check
  options = arguments.pop() if arguments and isinstance(arguments[-1], dict) else {}
  if kind not in KINDS:
    raise ValueError(f"a prediction's check must be one of {sorted(KINDS)}, got {kind!r}; "
                     "fix the config's predictions.")
  missing = [arm for arm in _arms(arguments) if not study.has(arm)]
  if missing:  # a study run in part (some of its sweeps): the check waits for the rest
    return (f"{kind}: {', '.join(_arms(arguments))}", None, NOT_RUN.format(", ".join(missing)))
  return KINDS[kind](study, options, *arguments)


def measures_of(declaration) -> dict[str, Measure]:
  return {name: Measure(**{k: tuple(v.items()) if k in ("differences", "offsets") else v
                           for k, v in fields.items()})
          for name, fields in declaration["measures"].items()}


def decide(declaration, records=None, *, values=None, family=None) -> list[tuple]:
  """(name, setting, [(check, held, measured)]) per prediction of ``declaration`` on
  ``records`` ({source: records}), or on ``values`` ({measure: {arm: {seed: value}}}, read
  already: the design checks, which read records, cannot be decided on them). ``family``:
  {source: [Comparison]}, the study's primary family (:func:`family_of`): a check that asks
  what one of its rows asks takes that row and its Holm p; every other tested check is decided
  after Holm's correction over those other checks and the declared null checks no test could
  decide (counted at p = 1).

  >>> declaration = {"setting": "arms", "measures": {"primary": {"column": "eval_nmse"}},
  ...                "predictions": (("P1", "h 1 against 4", (("above", "h1", "h4"),)),)}
  >>> values = {"h1": {s: 0.5 + 0.01 * s for s in range(6)}, "h4": dict.fromkeys(range(6), 0.1)}
  >>> print(table(decide(declaration, values={"primary": values}), "arms"), end="")
  | prediction | arms | check | measured | check holds | prediction held |
  |---|---|---|---|---|---|
  | P1 | h 1 against 4 | h1 > h4 | h1 - h4 = +0.425 [...], p 0.031, 6 seeds; Holm 0.031 over the other checks | yes | **yes** |
  """
  alpha = declaration.get("alpha", statistics.SIGNIFICANT)
  study = Study(records or {}, measures_of(declaration), alpha, values,
                {source: {(c.arm, c.baseline): c for c in rows}
                 for source, rows in (family or {}).items()})
  rows = [(name, setting, [_check(study, check) for check in checks])
          for name, setting, checks in declaration["predictions"]]
  tested = [check for _, _, checks in rows for check in checks
            if isinstance(check, Check) and check.p_adjusted is None]
  # The family is what was declared before the run: a null check that no test could decide (no
  # margin) still counts in it, at p = 1, so that leaving it untested never loosens the others.
  # (a check not run counts there only if it is of a kind tested in that family once run)
  untested = sum(1 for (_, _, declared), (_, _, checks) in zip(declaration["predictions"], rows)
                 for (kind, *_), check in zip(declared, checks)
                 if not isinstance(check, Check) and _not_tested(*check[1:])
                 and kind in HOLM_KINDS)
  adjusted = statistics.adjust(statistics.Comparison("", "", "", 0, 0, 0, 0, p, "")
                               for p in [check.p for check in tested] + [1.0] * untested)
  holm = {id(check): c.p_adjusted for check, c in zip(tested, adjusted)}
  decided = []
  for name, setting, checks in rows:
    out = []
    for check in checks:
      if isinstance(check, Check):
        q, family_words = ((check.p_adjusted, STUDY_FAMILY) if check.p_adjusted is not None
                           else (holm[id(check)], OTHER_CHECKS))
        verdict = None if math.isnan(q) else check.held(q)
        text = check.text if check.unadjusted else f"{check.text}; Holm {q:.2g} {family_words}"
        if check.null and verdict is None:
          text += f"; {NOT_TESTED}"
        check = (check.name, verdict, text)
      out.append(check)
    decided.append((name, setting, out))
  return decided


def held(decided) -> dict:
  """{prediction: whether every one of its checks held} (one not tested: not held)."""
  return {name: all(check[1] for check in checks) for name, _, checks in decided}


def _not_tested(held_, text) -> bool:
  """Whether a decided check is a declared null check that no test could decide (no margin), or
  one whose arms were not run: each counts in the family at p = 1."""
  return held_ is None and (str(text).endswith(NOT_TESTED) or str(text).startswith("not run:"))


def outcome(checks) -> bool | None:
  """A prediction's outcome from its checks: False where one failed, True where all held,
  None (not tested) where none failed and one could not be tested."""
  results = [check[1] for check in checks]
  return False if False in results else True if all(results) else None


def table(decided, setting: str) -> str:
  """The decided predictions as a markdown table; ``setting`` names the second column."""
  lines = [f"| prediction | {setting} | check | measured | check holds | prediction held |",
           "|---|---|---|---|---|---|"]
  for name, where, checks in decided:
    held_all = {True: "**yes**", False: "**no**", None: "**not tested**"}[outcome(checks)]
    for i, (check, check_held, text) in enumerate(checks):
      verdict = {True: "yes", False: "no", None: "untestable"}[check_held]
      if _not_tested(check_held, text):
        verdict = "not run" if str(text).startswith("not run:") else "not tested"
      lines.append(f"| {name if i == 0 else ''} | {where if i == 0 else ''} | {check} | {text} | "
                   f"{verdict} | {held_all if i == 0 else ''} |")
  return "\n".join(lines) + "\n"


def _smallest_raw_p(check, seeds: int) -> float | None:
  """The smallest p a tested check can give with ``seeds`` seeds per arm (None: untested)."""
  kind, *arguments = check
  options = arguments[-1] if arguments and isinstance(arguments[-1], dict) else {}
  if kind == "above":
    test = "paired_permutation" if options.get("paired", True) else "permutation"
    return statistics.smallest_p(test, seeds)
  if kind == "within":
    return 0.5 ** seeds  # TOST: both one-sided sign-flip tests at their most extreme
  return None


def smallest_p(declaration, seeds: int) -> float:
  """The smallest Holm-adjusted p any tested check of ``declaration`` can reach with ``seeds``
  seeds per arm: every check at its most extreme outcome, corrected over the family.

  >>> declaration = {"predictions": (("P", "", (("above", "a", "b"),) * 7),)}
  >>> round(smallest_p(declaration, 8), 4), round(smallest_p(declaration, 9), 4)
  (0.0547, 0.0273)
  """
  ps = [p for _, _, checks in declaration["predictions"] for check in checks
        if (p := _smallest_raw_p(check, seeds)) is not None]
  if not ps:
    return 0.0
  adjusted = statistics.adjust(statistics.Comparison("", "", "", seeds, 0, 0, 0, p, "")
                               for p in ps)
  return min(c.p_adjusted for c in adjusted)


def refusal(declaration, seeds: int) -> str | None:
  """One line saying why the predictions of ``declaration`` cannot reach their alpha with
  ``seeds`` seeds per arm and how many they need; None when they can."""
  alpha = declaration.get("alpha", statistics.SIGNIFICANT)
  if smallest_p(declaration, seeds) < alpha:
    return None
  needed = next((n for n in range(seeds, 65) if smallest_p(declaration, n) < alpha), None)
  more = f"declare num_seeds = {needed} or more" if needed else "no seed count up to 64 can"
  return (f"with {seeds} seeds per arm the predictions' tested checks cannot reach p < "
          f"{alpha:g} after Holm (smallest possible adjusted p "
          f"{smallest_p(declaration, seeds):.2g}); {more}, or fewer checks.")


def family_of(records, design) -> list[statistics.Comparison]:
  """The study's primary family on ``records``: the comparisons ``design`` declares, each arm at
  its chosen rate, Holm over them (the chosen rows of its comparisons.csv); [] without a design."""
  if design is None:
    return []
  return verdicts.compare(verdicts.choose(records, report_tables.measure_of(records), design),
                          design)


def read(sources) -> tuple[dict, dict]:
  """({source: records}, {source: primary family}) of {source: results.csv path, or a list of
  them}: a study run as several sweeps reads as one source, its family Holm over the
  comparisons of all of them (splitting a study into sweeps must not shrink the family it
  declared); an arm in two of them is refused."""
  from experiments import sweep_report  # matplotlib only here
  records, family = {}, {}
  for name, paths in sources.items():
    records[name], family[name] = [], []
    for path in [paths] if isinstance(paths, str) else paths:
      rows, design = sweep_report.read_csv(path)
      for row in rows:  # so that each arm's rate is chosen as its sweep chose it
        row["design"] = design
      twice = sorted({r["variant"] for r in rows} & {r["variant"] for r in records[name]})
      if twice:
        raise ValueError(f"arms {twice} are in two results files of {name!r}; give each "
                         "sweep's results.csv once.")
      records[name] += rows
      family[name] += family_of(rows, design)
    if not isinstance(paths, str):
      family[name] = statistics.adjust(family[name])
  return records, family


def declaration_of(config: str) -> dict:
  """The declaration of ``config`` ("configs/ablations/X.py" or "...py:mode")."""
  path, _, mode = config.partition(":")
  module = importlib.import_module(os.path.normpath(path).removesuffix(".py").replace(os.sep, "."))
  if not hasattr(module, "predictions"):
    raise ValueError(f"{path} declares no predictions(mode); declare them there first.")
  return module.predictions(mode or None)


def main(argv=None) -> None:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="the study's config, path[:mode]")
  parser.add_argument("--results", action="append", required=True,
                      help="results.csv, or source=results.csv for a study of several sources; "
                      "given more than once, a source's sweeps read as one")
  parser.add_argument("--out", default=None, help="write the table here (markdown), and the "
                      "study's figure beside it")
  args = parser.parse_args(argv)
  try:
    declaration = declaration_of(args.config)
    sources = {}
    for item in args.results:  # a name given again: one more sweep of that source
      name, path = item.split("=", 1) if "=" in item else (RESULTS, item)
      sources.setdefault(name, []).append(path)
    records, family = read(sources)
    text = table(decide(declaration, records, family=family), declaration["setting"])
  except (ValueError, KeyError, OSError) as error:
    parser.exit(1, f"findings: {type(error).__name__}: {error}\n")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.write(text)
    if declaration.get("figure"):
      from experiments import study_figures  # matplotlib only here
      study_figures.FIGURES[declaration["figure"]](
          declaration, records, os.path.dirname(os.path.abspath(args.out)))
  print(text)


if __name__ == "__main__":
  main()
