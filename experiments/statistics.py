"""The statistics engine of every study: intervals that stay in the measure's range, tests that fit
the outcome, and Holm's correction over a study's family of comparisons. Every test and interval
is scipy.stats'; what is written here only chooses among them and keeps ties and zero variance
defined (no warnings, no NaN where the answer is known).

The tests, by outcome (``TESTS``):

- ``"paired_permutation"``: a continuous measure (an NMSE, an accuracy), arm against reference
  paired by seed (seed s of every variant saw the same batches); the exact sign-flip test of the
  mean difference (``scipy.stats.permutation_test``, every one of the 2^n flips while n <= 13).
- ``"permutation"``: a continuous measure between arms compared unpaired (their seeds saw
  different data, or a study declares it so): the permutation test of the difference of means.
  With few seeds and a large effect it reaches a smaller p than the paired test (5 seeds each:
  2 / C(10, 5) = 0.008 against 2 / 2^5 = 0.06).
- ``"solve_rate"``: a threshold outcome (solved or stuck), the share of seeds that reach it;
  Fisher's exact test, Wilson intervals per arm, Newcombe's interval for the difference.
- ``"time_to_solve"``: the step at which a seed first reaches the threshold, censored at the
  end of training where it never does. Paired by seed: the sign-flip test of the mean restricted
  time (a never-solved seed counts as one evaluation past the last); unpaired: the log-rank test
  (``scipy.stats.logrank`` on ``CensoredData``).

Intervals (95%) of a mean and of a mean paired difference are Student's t intervals
(``scipy.stats.t``), of a difference between independent arms Welch's (``scipy.stats.ttest_ind``):
simulated at 5, 8 and 10 seeds they cover 94-95% of the time for normal data and 93-95% for
bimodal data, where the percentile bootstrap covered 83-93% and BCa 83-88% for normal data
(tests/test_statistics_calibration.py). Where the measure has a range (an accuracy in [0, 1], an
NMSE or a loss at least 0, see :func:`measure_range`) the interval is cut at it: the true mean
lies in the range, so cutting never excludes it and the coverage is unchanged.

A "no difference" is claimed only by :func:`equivalence_test` (two one-sided tests against a
margin declared before the run, paired or not, with the 90% interval that matches it); otherwise a
report says "no difference detected with n seeds". :func:`plan` sizes a design before it runs:
the smallest Holm-adjusted p it can reach, its power for a declared effect by simulation, and the
seeds it needs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

LEVEL = 0.95
SIGNIFICANT = 0.05
POWER = 0.8  # the power a declared effect must have, by simulation
TESTS = ("paired_permutation", "permutation", "solve_rate", "time_to_solve")
EQUIVALENCE_TESTS = ("tost_paired", "tost_unpaired")
CHOSEN, MATCHED = "chosen", "matched"  # the learning rate a comparison row uses
EXACT_UP_TO = 13  # seeds: 2^13 sign flips, all of them; beyond, 9999 random ones
MAX_SEEDS = 64  # the most seeds per arm :func:`plan` looks for
_RESAMPLES = 9999


def _rng(seed: int = 0):
  """A fixed stream, so that a report redone from the same CSV prints the same numbers."""
  return np.random.default_rng(seed)


def _finite(values) -> np.ndarray:
  values = np.asarray(values, np.float64)
  return values[np.isfinite(values)]


def measure_range(name: str) -> tuple[float, float]:
  """The values a measure named ``name`` can take: an accuracy [0, 1], a loss or an NMSE
  [0, inf), else unbounded.

  >>> measure_range("eval_accuracy"), measure_range("eval_nmse"), measure_range("steps")
  ((0.0, 1.0), (0.0, inf), (-inf, inf))
  """
  if name.endswith("accuracy"):
    return 0.0, 1.0
  if name.endswith(("loss", "nmse")):
    return 0.0, math.inf
  return -math.inf, math.inf


def difference_range(lower: float = -math.inf, upper: float = math.inf) -> tuple[float, float]:
  """The range of a difference of two values in [lower, upper].

  >>> difference_range(0.0, 1.0)
  (-1.0, 1.0)
  """
  return lower - upper, upper - lower


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One row of comparisons.csv: ``estimate`` (arm minus reference) with its interval
  [low, high] (95%; 90% for an equivalence test, the interval that matches it), the test's p
  over n seeds (pairs, or the smaller arm unpaired), and p after Holm's correction over the
  study's family (filled by :func:`adjust`; NaN for a row outside the family).

  ``margin``: for an equivalence test (``test`` in EQUIVALENCE_TESTS), the declared margin: its p
  is that of the two one-sided tests that the difference lies in (-margin, margin); NaN for a
  test of a difference. ``rate``: CHOSEN where each arm is at the learning rate it chose, MATCHED
  where the arm is at the reference's chosen rate (outside the Holm family)."""
  metric: str
  arm: str
  baseline: str
  n: int
  estimate: float
  low: float
  high: float
  p: float
  test: str
  p_adjusted: float = math.nan
  margin: float = math.nan
  rate: str = CHOSEN

  FIELDS = ("metric", "arm", "baseline", "n", "estimate", "low", "high", "p", "p_adjusted",
            "test", "margin", "rate")

  @property
  def is_equivalence(self) -> bool:
    return self.test in EQUIVALENCE_TESTS

  @property
  def level(self) -> float:
    """The confidence level of [low, high]: 1 - 2 alpha for an equivalence test, else LEVEL."""
    return 1 - 2 * SIGNIFICANT if self.is_equivalence else LEVEL

  @property
  def decisive_p(self) -> float:
    """The p a verdict stands on: Holm's where the row is in a family, else the raw p."""
    return self.p_adjusted if math.isfinite(self.p_adjusted) else self.p

  @classmethod
  def of_row(cls, row: dict) -> "Comparison":
    """A row of comparisons.csv (strings), old (without margin and rate) or new.

    >>> Comparison.of_row({"metric": "m", "arm": "a", "baseline": "b", "n": "5",
    ...                    "estimate": "0.1", "low": "0", "high": "0.2", "p": "0.06",
    ...                    "p_adjusted": "0.12", "test": "paired_permutation"}).rate
    'chosen'
    """
    def number(name):
      return float(row[name]) if row.get(name) not in (None, "") else math.nan
    return cls(row["metric"], row["arm"], row["baseline"], int(float(row["n"])),
               number("estimate"), number("low"), number("high"), number("p"), row["test"],
               number("p_adjusted"), number("margin"), row.get("rate") or CHOSEN)


def mean_interval(values, lower=-math.inf, upper=math.inf) -> tuple[float, float, float]:
  """(mean, low, high): Student's t 95% interval of the mean of the finite values, cut at
  [lower, upper] (the measure's range: the mean lies in it, so cutting keeps the coverage); the
  mean alone (low == high) when the values do not vary or fewer than two are finite; NaNs when
  none is.

  >>> mean_interval([0.5, 0.5, 0.5])
  (0.5, 0.5, 0.5)
  >>> [round(x, 3) for x in mean_interval([1.0, 2.0, 3.0])]  # 2 +- t(0.975, 2) * 1 / sqrt(3)
  [2.0, -0.484, 4.484]
  >>> mean, low, high = mean_interval([0.6, 1.0, 1.0, 1.0], 0.0, 1.0)
  >>> mean, high
  (0.9, 1.0)
  """
  values = _finite(values)
  if len(values) == 0:
    return math.nan, math.nan, math.nan
  mean = float(values.mean())
  sem = stats.sem(values) if len(values) > 1 else 0.0
  if not sem > 0:  # one value, values that do not vary, or a spread below float's range
    return mean, mean, mean
  low, high = stats.t.interval(LEVEL, len(values) - 1, loc=mean, scale=sem)
  return mean, float(max(low, lower)), float(min(high, upper))


def difference_interval(a, b, lower=-math.inf, upper=math.inf) -> tuple[float, float, float]:
  """(difference of means, low, high): Welch's 95% interval of mean(a) - mean(b) for
  independent arms (finite values), cut at [lower, upper] (see :func:`difference_range`); the
  difference alone when neither arm varies; NaN bounds when an arm with one value meets one that
  varies (no spread to estimate for it).

  >>> [round(x, 3) for x in difference_interval([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])]
  [2.0, -0.484, 4.484]
  """
  a, b = _finite(a), _finite(b)
  if len(a) == 0 or len(b) == 0:
    return math.nan, math.nan, math.nan
  estimate = float(a.mean() - b.mean())
  if np.ptp(a) == 0 and np.ptp(b) == 0:
    return estimate, estimate, estimate
  if min(len(a), len(b)) < 2:
    return estimate, math.nan, math.nan
  interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(LEVEL)
  return estimate, float(max(interval.low, lower)), float(min(interval.high, upper))


def rate_interval(successes: int, n: int) -> tuple[float, float, float]:
  """(rate, low, high): the share of ``n`` seeds that succeeded, with Wilson's 95% interval.

  >>> [round(x, 3) for x in rate_interval(10, 10)]
  [1.0, 0.722, 1.0]
  """
  if n == 0:
    return math.nan, math.nan, math.nan
  interval = stats.binomtest(int(successes), int(n)).proportion_ci(LEVEL, method="wilson")
  return successes / n, float(interval.low), float(interval.high)


def _flips(n: int) -> int:
  return max(2 ** EXACT_UP_TO, _RESAMPLES) if n <= EXACT_UP_TO else _RESAMPLES


def _sign_flip_p(differences, alternative: str = "two-sided") -> float:
  """p of the sign-flip test that the differences' mean is 0, exact (every flip) for n <=
  EXACT_UP_TO; 1 when every difference is 0."""
  if np.all(differences == 0):
    return 1.0
  result = stats.permutation_test(
      (differences,), np.mean, permutation_type="samples", vectorized=True,
      alternative=alternative, rng=_rng(), n_resamples=_flips(len(differences)))
  return float(min(result.pvalue, 1.0))


def _mean_difference(x, y, axis):
  return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def _permutation_p(a, b, alternative: str = "two-sided") -> float:
  """p of the permutation test of the difference of means of independent ``a`` and ``b``."""
  p = stats.permutation_test((a, b), _mean_difference, vectorized=True, rng=_rng(),
                             n_resamples=_RESAMPLES, alternative=alternative).pvalue
  return float(min(p, 1.0))


def _pairs(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  both = np.isfinite(a) & np.isfinite(b)
  return a[both], b[both]


def paired_difference(metric, arm, baseline, a, b, *, lower=-math.inf,
                      upper=math.inf) -> Comparison:
  """``a[i]`` against ``b[i]`` (one seed each, NaN pairs left out): the mean difference, its t
  interval (cut at :func:`difference_range` of the measure's range [lower, upper]) and the exact
  sign-flip p.

  >>> c = paired_difference("nmse", "x", "y", [0.5, 0.6, 0.7, 0.6, 0.5, 0.6], [0.1] * 6)
  >>> round(c.estimate, 3), c.p  # every difference positive: 2 of the 64 flips are as extreme
  (0.483, 0.03125)
  """
  a, b = _pairs(a, b)
  differences = a - b
  estimate, low, high = mean_interval(differences, *difference_range(lower, upper))
  p = _sign_flip_p(differences) if len(differences) else math.nan
  return Comparison(metric, arm, baseline, len(differences), estimate, low, high, p,
                    "paired_permutation")


def independent_difference(metric, arm, baseline, a, b, *, lower=-math.inf,
                           upper=math.inf) -> Comparison:
  """``a`` against ``b`` from different seeds: the difference of means, Welch's interval of it
  (:func:`difference_interval`) and the two-sided permutation test of exchangeable labels."""
  a, b = _finite(a), _finite(b)
  if len(a) == 0 or len(b) == 0:
    return Comparison(metric, arm, baseline, 0, math.nan, math.nan, math.nan, math.nan,
                      "permutation")
  if np.ptp(np.concatenate([a, b])) == 0:
    return Comparison(metric, arm, baseline, min(len(a), len(b)), 0.0, 0.0, 0.0, 1.0,
                      "permutation")
  estimate, low, high = difference_interval(a, b, *difference_range(lower, upper))
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, low, high,
                    _permutation_p(a, b), "permutation")


def solve_rate_difference(metric, arm, baseline, a_solved, b_solved) -> Comparison:
  """Solve rates (booleans per seed): the difference of the rates, Newcombe's hybrid score
  interval from the two Wilson intervals, and Fisher's exact test.

  >>> c = solve_rate_difference("solved", "x", "y", [True] * 5, [False] * 5)
  >>> c.estimate, round(c.p, 4)
  (1.0, 0.0079)
  """
  a, b = np.asarray(a_solved, bool), np.asarray(b_solved, bool)
  ka, kb = int(a.sum()), int(b.sum())
  if len(a) == 0 or len(b) == 0:
    return Comparison(metric, arm, baseline, 0, math.nan, math.nan, math.nan, math.nan,
                      "solve_rate")
  (ra, la, ua), (rb, lb, ub) = rate_interval(ka, len(a)), rate_interval(kb, len(b))
  estimate = ra - rb
  low = estimate - math.sqrt((ra - la) ** 2 + (ub - rb) ** 2)
  high = estimate + math.sqrt((ua - ra) ** 2 + (rb - lb) ** 2)
  table = [[ka, len(a) - ka], [kb, len(b) - kb]]
  p = float(stats.fisher_exact(table).pvalue)
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, max(low, -1.0),
                    min(high, 1.0), min(p, 1.0), "solve_rate")


def restricted_times(steps, horizon) -> np.ndarray:
  """Steps to the threshold with the seeds that never reached it (NaN) at ``horizon``."""
  steps = np.asarray(steps, np.float64)
  return np.where(np.isfinite(steps), np.minimum(steps, horizon), horizon)


def time_to_solve_difference(metric, arm, baseline, a_steps, b_steps, horizon,
                             paired: bool) -> Comparison:
  """Steps to the threshold (NaN: never reached, censored at ``horizon``): the difference of
  the mean restricted times (a never-solved seed counted at ``horizon``) with a t interval
  (Welch's unpaired) inside [-horizon, horizon]; p from the paired sign-flip test on the
  restricted times, or unpaired from the log-rank test of the censored times.

  >>> c = time_to_solve_difference("steps", "x", "y", [100, 200, 100, 100, 200, 100],
  ...                              [math.nan] * 6, horizon=1100, paired=True)
  >>> c.estimate, c.p
  (-966.66..., 0.03125)
  """
  a_steps, b_steps = np.asarray(a_steps, np.float64), np.asarray(b_steps, np.float64)
  a, b = restricted_times(a_steps, horizon), restricted_times(b_steps, horizon)
  if paired:
    comparison = paired_difference(metric, arm, baseline, a, b, lower=0.0, upper=horizon)
    return dataclasses.replace(comparison, test="time_to_solve")
  unpaired = independent_difference(metric, arm, baseline, a, b, lower=0.0, upper=horizon)
  estimate, low, high = unpaired.estimate, unpaired.low, unpaired.high
  if np.all(~np.isfinite(a_steps)) and np.all(~np.isfinite(b_steps)):
    p = 1.0  # both arms censored throughout: nothing to compare
  else:
    censored = lambda s: stats.CensoredData(  # noqa: E731
        uncensored=s[np.isfinite(s)], right=np.full((~np.isfinite(s)).sum(), horizon))
    p = float(stats.logrank(censored(a_steps), censored(b_steps)).pvalue)
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, low, high, p,
                    "logrank")


# Equivalence: two one-sided tests (TOST), each the exact (or permutation) test of a shifted
# difference, and the 90% interval made by inverting the same one-sided tests, so that the
# interval lies inside (-margin, margin) exactly when the TOST p is below SIGNIFICANT.


def _greater_p(a, b, delta: float, paired: bool) -> float:
  """One-sided p that the (paired) mean difference of ``a`` and ``b`` exceeds ``delta``."""
  if paired:
    return _sign_flip_p(a - b - delta, "greater")
  return _permutation_p(a - delta, b, "greater")


def _lower_bound(a, b, paired: bool, alpha: float) -> float:
  """The largest delta that the one-sided test at ``alpha`` shows the difference to exceed:
  the lower end of the 1 - 2 alpha interval (-inf when no data can reach ``alpha``). The
  one-sided p grows with delta (for the fixed flips or permutations of the fixed stream)."""
  span = max(np.ptp(np.concatenate([a, b])), 1.0)
  below = (np.min(a - b) if paired else np.min(a) - np.max(b)) - span
  above = np.max(a - b) if paired else np.max(a) - np.min(b)
  if _greater_p(a, b, below, paired) >= alpha:
    return -math.inf
  for _ in range(60):  # bisection to ~1e-18 of the data's span
    middle = (below + above) / 2
    if _greater_p(a, b, middle, paired) < alpha:
      below = middle
    else:
      above = middle
  return float(below)


def equivalence_test(metric, arm, baseline, a, b, margin: float, *, paired: bool = True,
                     horizon: float | None = None) -> Comparison:
  """TOST: the two one-sided tests that mean(a - b) (paired by seed) or mean(a) - mean(b)
  (unpaired) lies inside (-margin, margin), each the exact sign-flip test of the shifted pairs or
  the permutation test of the shifted arm; p is the larger of the two. [low, high] is the 90%
  interval from inverting the same one-sided tests: it lies inside (-margin, margin) exactly when
  p < SIGNIFICANT, and only then may a report say "same". For time-to-threshold give ``horizon``:
  NaN steps (never reached) count as ``horizon``, as in :func:`time_to_solve_difference`.

  With n pairs p is at least 2^-n, so 5 or more seeds are needed; unpaired with n per arm, at
  least 1 / C(2n, n) (3 seeds: 0.05).

  >>> c = equivalence_test("acc", "x", "y", [0.91, 0.90, 0.92, 0.90, 0.91, 0.90],
  ...                      [0.90] * 6, margin=0.05)
  >>> c.p, c.low > -0.05 and c.high < 0.05, c.test  # every difference inside: 1 flip in 64
  (0.015625, True, 'tost_paired')
  >>> steps = equivalence_test("steps", "x", "y", [200, 200, 300, math.nan, 200],
  ...                          [200, 300, 300, 300, 200], margin=100, horizon=1000)
  >>> steps.estimate, steps.p  # the never-solved seed counts at 1000: not equivalent
  (120.0, 0.53125)
  """
  if horizon is not None:
    a, b = restricted_times(a, horizon), restricted_times(b, horizon)
  a, b = _pairs(a, b) if paired else (_finite(a), _finite(b))
  test = "tost_paired" if paired else "tost_unpaired"
  if len(a) == 0 or len(b) == 0:
    return Comparison(metric, arm, baseline, 0, math.nan, math.nan, math.nan, math.nan, test,
                      margin=margin)
  estimate = float(np.mean(a - b) if paired else a.mean() - b.mean())
  p = max(_greater_p(a, b, -margin, paired), _greater_p(b, a, -margin, paired))
  low = _lower_bound(a, b, paired, SIGNIFICANT)
  high = -_lower_bound(b, a, paired, SIGNIFICANT)
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, low, high, p, test,
                    margin=margin)


def equivalence(a, b, margin: float, paired: bool = True) -> float:
  """The p of :func:`equivalence_test` (TOST) that ``a`` and ``b`` differ by less than
  ``margin``: below SIGNIFICANT, the arms are equivalent at that margin."""
  return equivalence_test("", "", "", a, b, margin, paired=paired).p


def friedman(blocks) -> float:
  """Friedman's test that the settings (columns of ``blocks``, [seeds, settings]) differ, seeds
  as blocks: scipy's p, and 1 where every block is constant (nothing moves; its statistic is
  0/0 there).

  >>> friedman([[2, 2, 2]] * 10), round(friedman([[1, 2, 3]] * 10), 4)
  (1.0, 0.0)
  """
  blocks = np.asarray(blocks)
  if (blocks == blocks[:, :1]).all():
    return 1.0
  return float(stats.friedmanchisquare(*blocks.T).pvalue)


def seeds_beyond_chance(meeting: int, seeds: int, chance: float, alpha: float,
                        min_share: float) -> tuple[float, bool]:
  """A prediction that each seed meets a criterion: scipy.stats.binomtest of ``meeting`` of
  ``seeds`` against the chance ``chance`` (one-sided, greater), and whether it holds (p below
  ``alpha`` and at least ``min_share`` of the seeds meeting it).

  >>> p, holds = seeds_beyond_chance(9, 10, 0.5, 0.05, 0.8)
  >>> round(p, 4), holds
  (0.0107, True)
  """
  p = float(stats.binomtest(meeting, seeds, chance, alternative="greater").pvalue)
  return p, bool(p < alpha and meeting >= min_share * seeds)


def adjust(comparisons) -> list[Comparison]:
  """The comparisons with ``p_adjusted``: Holm's step-down correction over the whole family
  (a NaN p stays NaN and does not count). Controls the chance of any false positive at 5%.

  >>> [c.p_adjusted for c in adjust([Comparison("m", "a", "b", 5, 0, 0, 0, p, "t")
  ...                                 for p in (0.01, 0.04, 0.03)])]
  [0.03, 0.06, 0.06]
  """
  comparisons = list(comparisons)
  ps = np.array([c.p for c in comparisons], np.float64)
  valid = np.flatnonzero(np.isfinite(ps))
  adjusted = np.full(len(ps), math.nan)
  order = valid[np.argsort(ps[valid], kind="stable")]
  running = 0.0
  for rank, index in enumerate(order):
    running = max(running, min(1.0, (len(order) - rank) * ps[index]))
    adjusted[index] = running
  return [dataclasses.replace(c, p_adjusted=float(q)) for c, q in zip(comparisons, adjusted)]


def smallest_p(test: str, n: int, family: int = 1) -> float:
  """The smallest Holm-adjusted p that ``test`` can give with ``n`` seeds per arm in a family of
  ``family`` comparisons (the most extreme outcome in the smallest-p position): below
  SIGNIFICANT, the study can show an effect; otherwise it cannot, whatever happens.

  >>> smallest_p("paired_permutation", 3), smallest_p("solve_rate", 10, family=12) < 0.05
  (0.25, True)
  """
  check_test(test)
  if n < 1:
    return 1.0
  if test in ("paired_permutation", "time_to_solve"):
    p = 2.0 / 2 ** min(n, 30)
  elif test == "permutation":
    p = 2.0 / math.comb(2 * n, n)
  else:  # solve_rate
    p = float(stats.fisher_exact([[n, 0], [0, n]]).pvalue)
  return min(1.0, family * p)


def check_test(test: str) -> None:
  """Refuses, in one line naming them, a test of a difference that is not one of TESTS."""
  if test not in TESTS:
    raise ValueError(f"test must be one of {TESTS}, got {test!r}.")


def seeds_to_reach(test: str, family: int = 1, alpha: float = SIGNIFICANT) -> int:
  """The fewest seeds per arm with which ``test`` can give a Holm-adjusted p below ``alpha`` in
  a family of ``family`` comparisons.

  >>> seeds_to_reach("paired_permutation", family=7)  # 8 seeds: 7 * 2/256 = 0.055
  9
  """
  return next(n for n in range(1, 10 * MAX_SEEDS) if smallest_p(test, n, family) < alpha)


def _simulated_ps(test, seeds, effect, spread, base_rate, simulations, rng) -> np.ndarray:
  """The p values of ``test`` itself on ``simulations`` simulated studies of ``seeds`` seeds
  per arm: the arm differs from its reference by ``effect`` (normal noise of sd ``spread`` on
  each seed's difference, or on each arm unpaired; for solve_rate, solve rates base_rate +
  effect and base_rate)."""
  if test == "solve_rate":
    a = rng.binomial(seeds, np.clip(base_rate + effect, 0.0, 1.0), simulations)
    b = rng.binomial(seeds, base_rate, simulations)
    tables = {(ka, kb): solve_rate_difference("", "", "", np.arange(seeds) < ka,
                                              np.arange(seeds) < kb).p
              for ka, kb in set(zip(a.tolist(), b.tolist()))}
    return np.array([tables[ka, kb] for ka, kb in zip(a.tolist(), b.tolist())])
  if test == "permutation":
    a = rng.normal(effect, spread, (simulations, seeds))
    b = rng.normal(0.0, spread, (simulations, seeds))
    return stats.permutation_test((a, b), _mean_difference, vectorized=True, axis=-1, batch=64,
                                  n_resamples=_RESAMPLES, rng=_rng()).pvalue
  differences = rng.normal(effect, spread, (simulations, seeds))  # paired tests
  return stats.permutation_test((differences,), np.mean, permutation_type="samples", axis=-1,
                                vectorized=True, batch=64, n_resamples=_flips(seeds),
                                rng=_rng()).pvalue


def power(test: str, seeds: int, family: int, effect: float, spread: float = 0.0, *,
          alpha: float = SIGNIFICANT, base_rate: float = math.nan,
          simulations: int = 1000) -> float:
  """The share of simulated studies (the actual test run on simulated data, a fixed stream) in
  which a true ``effect`` gives a Holm-adjusted p below ``alpha``: as the family's only true
  effect, so that it must pass alpha / family (a lower bound when other effects are true too).
  See :func:`_simulated_ps` for what is simulated.

  >>> power("paired_permutation", 8, 7, effect=1.0, spread=0.1)  # cannot reach 0.05 / 7
  0.0
  >>> power("paired_permutation", 9, 7, effect=1.0, spread=0.1)
  1.0
  """
  if test == "solve_rate" and not 0.0 <= base_rate <= 1.0:
    raise ValueError("a solve_rate effect needs base_rate, the reference's solve rate in "
                     f"[0, 1], got {base_rate}.")
  check_test(test)
  ps = _simulated_ps(test, seeds, effect, spread, base_rate, simulations, _rng(seeds))
  return float(np.mean(ps * family < alpha))


def seeds_for_power(test: str, family: int, effect: float, spread: float = 0.0, *,
                    alpha: float = SIGNIFICANT, target: float = POWER,
                    base_rate: float = math.nan, simulations: int = 1000) -> int | None:
  """The fewest seeds per arm (up to MAX_SEEDS; None past it) whose :func:`power` for
  ``effect`` reaches ``target``: a doubling search, then bisection (power grows with seeds)."""
  def enough(n):
    return power(test, n, family, effect, spread, alpha=alpha, base_rate=base_rate,
                 simulations=simulations) >= target
  low, high = seeds_to_reach(test, family, alpha) - 1, seeds_to_reach(test, family, alpha)
  while not enough(high):
    if high >= MAX_SEEDS:
      return None
    low, high = high, min(2 * high, MAX_SEEDS)
  while high - low > 1:
    middle = (low + high) // 2
    low, high = (low, middle) if enough(middle) else (middle, high)
  return high


@dataclasses.dataclass(frozen=True)
class Plan:
  """A design checked before it runs (:func:`plan`). ``smallest_p``: the smallest Holm-adjusted p
  the design can give; ``seeds_to_reach``: the fewest seeds per arm that can reach alpha;
  for a declared ``effect`` (with ``spread``), ``power`` by simulation and ``seeds_for_power``
  (the fewest seeds with POWER; None when more than MAX_SEEDS); NaN / None without one."""
  test: str
  seeds: int
  family: int
  alpha: float
  smallest_p: float
  seeds_to_reach: int
  effect: float = math.nan
  spread: float = math.nan
  power: float = math.nan
  seeds_for_power: int | None = None

  @property
  def reachable(self) -> bool:
    """Whether any outcome can give an adjusted p below alpha."""
    return self.smallest_p < self.alpha

  @property
  def powered(self) -> bool:
    """Reachable and, for a declared effect, power at least POWER."""
    return self.reachable and not self.power < POWER

  def problem(self) -> str:
    """One line naming what the design lacks and the seeds it needs; "" when it is powered."""
    head = (f"the {self.test} test over {self.seeds} seeds per arm, Holm over {self.family} "
            "comparisons")
    if not self.reachable:
      return (f"{head} cannot reach p < {self.alpha:g} (smallest adjusted p "
              f"{self.smallest_p:.2g}): it needs {self.seeds_to_reach} seeds per arm.")
    if not self.powered:
      needs = (f"{self.seeds_for_power} seeds per arm" if self.seeds_for_power
               else f"more than {MAX_SEEDS} seeds per arm")
      return (f"{head} has power {self.power:.2f} for the declared effect {self.effect:g} "
              f"(spread {self.spread:g}); {POWER:.0%} needs {needs}.")
    return ""


def plan(test: str, seeds: int, family: int, *, alpha: float = SIGNIFICANT,
         effect: float | None = None, spread: float = 0.0, base_rate: float = math.nan,
         simulations: int = 1000) -> Plan:
  """Checks a declared design before training: ``test`` (TESTS) with ``seeds`` per arm in a
  family of ``family`` comparisons at ``alpha``; optionally the smallest ``effect`` it must show
  (arm minus reference: in the measure's units, steps for time_to_solve, a difference of solve
  rates from ``base_rate`` for solve_rate) with an assumed ``spread`` (the sd of a seed's paired
  difference, or of a seed's value unpaired). A pure function: the same answer every call.

  >>> p = plan("paired_permutation", 8, 7)
  >>> round(p.smallest_p, 3), p.reachable, p.seeds_to_reach
  (0.055, False, 9)
  >>> p.problem().split(": ")[-1]
  'it needs 9 seeds per arm.'
  >>> p = plan("paired_permutation", 10, 3, effect=0.1, spread=0.1)
  >>> p.reachable, p.power < POWER, p.seeds_for_power
  (True, True, 14)
  """
  checked = Plan(test, seeds, family, alpha, smallest_p(test, seeds, family),
                 seeds_to_reach(test, family, alpha))
  if effect is None:
    return checked
  options = dict(alpha=alpha, base_rate=base_rate, simulations=simulations)
  return dataclasses.replace(
      checked, effect=effect, spread=spread,
      power=power(test, seeds, family, effect, spread, **options),
      seeds_for_power=seeds_for_power(test, family, effect, spread, **options))


def first_step_reaching(steps, values, target: float, higher_is_better: bool = True) -> float:
  """The first step whose value is at or past ``target`` (>= for an accuracy, <= for an NMSE);
  NaN if none."""
  values = np.asarray(values, np.float64)
  reached = np.flatnonzero(values >= target if higher_is_better else values <= target)
  return float(np.asarray(steps)[reached[0]]) if len(reached) else math.nan


def lr_sensitivity(final_losses, initial_loss: float) -> float:
  """:ref:`Wortsman et al. (2023) <ref-wortsman2023>`, eq. 1: the mean over the learning-rate grid
  of
  min(L(lr), L0) - min_lr L(lr), for final losses L(lr) (a diverged run, NaN, counts as L0, the
  loss at initialisation). 0 when every learning rate reaches the best loss; at most L0 - L*.

  >>> lr_sensitivity([0.5, 0.2, float("nan")], initial_loss=1.0)  # (0.3 + 0 + 0.8) / 3
  0.3666...
  """
  losses = np.asarray(final_losses, np.float64)
  clipped = np.where(np.isfinite(losses), np.minimum(losses, initial_loss), initial_loss)
  return float(np.mean(clipped - clipped.min()))
