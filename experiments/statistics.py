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

A "no difference" is claimed only by :func:`equivalence` (two one-sided tests against a stated
margin); otherwise a report says "no difference detected with n seeds".
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

LEVEL = 0.95
SIGNIFICANT = 0.05
TESTS = ("paired_permutation", "permutation", "solve_rate", "time_to_solve")
EXACT_UP_TO = 13  # seeds: 2^13 sign flips, all of them; beyond, 9999 random ones
_RESAMPLES = 9999


def _rng():
  """A fixed stream, so that a report redone from the same CSV prints the same numbers."""
  return np.random.default_rng(0)


def _finite(values) -> np.ndarray:
  values = np.asarray(values, np.float64)
  return values[np.isfinite(values)]


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One row of comparisons.csv: ``estimate`` (arm minus reference) with its 95% interval
  [low, high], the test's two-sided p over n seeds (pairs, or the smaller arm unpaired), and p
  after Holm's correction over the study's family (filled by :func:`adjust`)."""
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

  FIELDS = ("metric", "arm", "baseline", "n", "estimate", "low", "high", "p", "p_adjusted",
            "test")


def mean_interval(values, lower=-math.inf, upper=math.inf) -> tuple[float, float, float]:
  """(mean, low, high): the 95% percentile-bootstrap interval of the mean of the finite values,
  inside [lower, upper] as every resampled mean is; the mean alone (low == high) when the values
  do not vary or fewer than two are finite; NaNs when none is.

  >>> mean_interval([0.5, 0.5, 0.5])
  (0.5, 0.5, 0.5)
  >>> mean, low, high = mean_interval([0.6, 1.0, 1.0, 1.0], 0.0, 1.0)
  >>> mean, high
  (0.9, 1.0)
  """
  values = _finite(values)
  if len(values) == 0:
    return math.nan, math.nan, math.nan
  mean = float(values.mean())
  if len(values) < 2 or np.ptp(values) == 0:
    return mean, mean, mean
  result = stats.bootstrap((values,), np.mean, confidence_level=LEVEL, method="percentile",
                           n_resamples=_RESAMPLES, rng=_rng())
  low, high = result.confidence_interval
  return mean, float(max(low, lower)), float(min(high, upper))


def rate_interval(successes: int, n: int) -> tuple[float, float, float]:
  """(rate, low, high): the share of ``n`` seeds that succeeded, with Wilson's 95% interval.

  >>> [round(x, 3) for x in rate_interval(10, 10)]
  [1.0, 0.722, 1.0]
  """
  if n == 0:
    return math.nan, math.nan, math.nan
  interval = stats.binomtest(int(successes), int(n)).proportion_ci(LEVEL, method="wilson")
  return successes / n, float(interval.low), float(interval.high)


def _sign_flip_p(differences, alternative: str = "two-sided") -> float:
  """p of the sign-flip test that the differences' mean is 0, exact (every flip) for n <=
  EXACT_UP_TO; 1 when every difference is 0."""
  if np.all(differences == 0):
    return 1.0
  result = stats.permutation_test(
      (differences,), np.mean, permutation_type="samples", vectorized=True,
      alternative=alternative, rng=_rng(),
      n_resamples=max(2 ** EXACT_UP_TO, _RESAMPLES) if len(differences) <= EXACT_UP_TO
      else _RESAMPLES)
  return float(min(result.pvalue, 1.0))


def _pairs(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  both = np.isfinite(a) & np.isfinite(b)
  return a[both], b[both]


def paired_difference(metric, arm, baseline, a, b) -> Comparison:
  """``a[i]`` against ``b[i]`` (one seed each, NaN pairs left out): the mean difference, its
  bootstrap interval and the exact sign-flip p.

  >>> c = paired_difference("nmse", "x", "y", [0.5, 0.6, 0.7, 0.6, 0.5, 0.6], [0.1] * 6)
  >>> round(c.estimate, 3), c.p  # every difference positive: 2 of the 64 flips are as extreme
  (0.483, 0.03125)
  """
  a, b = _pairs(a, b)
  differences = a - b
  estimate, low, high = mean_interval(differences)
  p = _sign_flip_p(differences) if len(differences) else math.nan
  return Comparison(metric, arm, baseline, len(differences), estimate, low, high, p,
                    "paired_permutation")


def independent_difference(metric, arm, baseline, a, b) -> Comparison:
  """``a`` against ``b`` from different seeds: the difference of means, a bootstrap interval
  of it, and the two-sided permutation test of exchangeable labels."""
  a, b = _finite(a), _finite(b)
  if len(a) == 0 or len(b) == 0:
    return Comparison(metric, arm, baseline, 0, math.nan, math.nan, math.nan, math.nan,
                      "permutation")
  estimate = float(a.mean() - b.mean())
  if np.ptp(np.concatenate([a, b])) == 0:
    return Comparison(metric, arm, baseline, min(len(a), len(b)), 0.0, 0.0, 0.0, 1.0,
                      "permutation")
  statistic = lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis)  # noqa: E731
  p = stats.permutation_test((a, b), statistic, vectorized=True, n_resamples=_RESAMPLES,
                             rng=_rng()).pvalue
  if np.ptp(a) == 0 and np.ptp(b) == 0:
    low = high = estimate
  else:
    low, high = stats.bootstrap((a, b), statistic, vectorized=True, method="percentile",
                                n_resamples=_RESAMPLES, rng=_rng()).confidence_interval
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, float(low),
                    float(high), float(min(p, 1.0)), "permutation")


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
  the mean restricted times (a never-solved seed counted at ``horizon``) with a bootstrap
  interval; p from the paired sign-flip test on the restricted times, or unpaired from the
  log-rank test of the censored times.

  >>> c = time_to_solve_difference("steps", "x", "y", [100, 200, 100, 100, 200, 100],
  ...                              [math.nan] * 6, horizon=1100, paired=True)
  >>> c.estimate, c.p
  (-966.66..., 0.03125)
  """
  a_steps, b_steps = np.asarray(a_steps, np.float64), np.asarray(b_steps, np.float64)
  a, b = restricted_times(a_steps, horizon), restricted_times(b_steps, horizon)
  if paired:
    comparison = paired_difference(metric, arm, baseline, a, b)
    return dataclasses.replace(comparison, test="time_to_solve")
  unpaired = independent_difference(metric, arm, baseline, a, b)
  estimate, low, high = unpaired.estimate, unpaired.low, unpaired.high
  if np.all(~np.isfinite(a_steps)) and np.all(~np.isfinite(b_steps)):
    p = 1.0  # both arms censored throughout: nothing to compare
  else:
    censored = lambda s: stats.CensoredData(  # noqa: E731
        uncensored=s[np.isfinite(s)], right=np.full((~np.isfinite(s)).sum(), horizon))
    p = float(stats.logrank(censored(a_steps), censored(b_steps)).pvalue)
  return Comparison(metric, arm, baseline, min(len(a), len(b)), estimate, low, high, p,
                    "logrank")


def equivalence(a, b, margin: float) -> float:
  """p of two one-sided paired sign-flip tests (TOST) that the mean of a - b lies within
  (-margin, margin): below SIGNIFICANT, the arms are equivalent at that margin. With n seeds it
  can be no smaller than 2^-n (one-sided: one flip of the 2^n as extreme)."""
  a, b = _pairs(a, b)
  differences = a - b
  if len(differences) == 0:
    return math.nan
  return max(_sign_flip_p(differences + margin, "greater"),
             _sign_flip_p(differences - margin, "less"))


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
  if n < 1:
    return 1.0
  if test in ("paired_permutation", "time_to_solve"):
    p = 2.0 / 2 ** min(n, 30)
  elif test == "permutation":
    p = 2.0 / math.comb(2 * n, n)
  elif test == "solve_rate":
    p = float(stats.fisher_exact([[n, 0], [0, n]]).pvalue)
  else:
    raise ValueError(f"test must be one of {TESTS}, got {test!r}.")
  return min(1.0, family * p)


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
