"""The statistics of a sweep report: 95% intervals over seeds, Welch's test between two arms, the
paired test between two arms that share their seeds,
steps to a target accuracy, and the learning-rate sensitivity of :ref:`Wortsman et al. (2023)
<ref-wortsman2023>`."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

LEVEL = 0.95
SIGNIFICANT = 0.05


def interval(values) -> tuple[float, float]:
  """(mean, half-width of the 95% Student-t interval) over the finite values; the half-width is
  NaN with fewer than two values.

  >>> interval([0.8, 0.9, 1.0])  # mean 0.9, half-width 4.303 * 0.1 / sqrt(3)
  (0.9, 0.2484...)
  """
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  if len(values) == 0:
    return math.nan, math.nan
  if len(values) == 1:
    return float(values[0]), math.nan
  t = stats.t.ppf((1 + LEVEL) / 2, len(values) - 1)
  return float(values.mean()), float(t * values.std(ddof=1) / math.sqrt(len(values)))


def bounded_interval(values, lower=-math.inf, upper=math.inf) -> tuple[float, float, float]:
  """(mean, low, high): the 95% Student-t interval of :func:`interval` clipped to the range the
  measure can take (``[0, 1]`` for an accuracy, ``[0, inf)`` for a loss), so that a plot never
  draws an interval past a possible value; ``low == high == mean`` with fewer than two values.

  >>> bounded_interval([0.5, 1.0, 1.0], 0.0, 1.0)  # t-interval 0.833 +- 0.717, clipped at 1
  (0.8333..., 0.1162..., 1.0)
  """
  mean, half = interval(values)
  half = 0.0 if math.isnan(half) else half
  return mean, max(mean - half, lower), min(mean + half, upper)


def welch_p(a, b) -> float:
  """Two-sided p-value of Welch's t-test that the means of ``a`` and ``b`` are equal (NaN when
  either has fewer than two finite values; 1 when both are constant and equal)."""
  a, b = (np.asarray(x, np.float64) for x in (a, b))
  a, b = a[np.isfinite(a)], b[np.isfinite(b)]
  if len(a) < 2 or len(b) < 2:
    return math.nan
  if a.std() == 0 and b.std() == 0:
    return 1.0 if a.mean() == b.mean() else 0.0
  return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def paired(a, b) -> tuple[float, float, float, int]:
  """(mean of a - b, half-width of its 95% Student-t interval, two-sided p of the paired t-test,
  pairs) over the pairs where both values are finite: ``a[i]`` and ``b[i]`` share a seed (the
  same data order), so their difference removes what the seed adds to both.

  >>> paired([0.5, 0.6, 0.7], [0.1, 0.3, 0.2])[:2]  # differences 0.4, 0.3, 0.5
  (0.4..., 0.248...)
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  both = np.isfinite(a) & np.isfinite(b)
  differences = a[both] - b[both]
  mean, half = interval(differences)
  if len(differences) < 2:
    return mean, half, math.nan, len(differences)
  if differences.std() == 0:
    return mean, 0.0, 1.0 if mean == 0 else 0.0, len(differences)
  return mean, half, float(stats.ttest_rel(a[both], b[both]).pvalue), len(differences)


def first_step_reaching(steps, values, target: float) -> float:
  """The first step whose value is >= ``target`` (NaN if none)."""
  reached = np.flatnonzero(np.asarray(values, np.float64) >= target)
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
