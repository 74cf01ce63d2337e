"""The sweep report's statistics against values computed by hand."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats as scipy_stats

from experiments import statistics

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick


def test_interval_is_the_student_t_interval():
  mean, half = statistics.interval([0.8, 0.9, 1.0])
  assert mean == 0.9
  np.testing.assert_allclose(half, 4.302653 * 0.1 / math.sqrt(3), rtol=1e-6)  # t(0.975, 2)
  mean, half = statistics.interval([1.0, 3.0, float("nan")])  # a diverged run is left out
  np.testing.assert_allclose(half, 12.7062047 * math.sqrt(2) / math.sqrt(2), rtol=1e-6)
  assert statistics.interval([0.5])[0] == 0.5 and math.isnan(statistics.interval([0.5])[1])
  assert math.isnan(statistics.interval([float("nan")])[0])


def test_welch_p_against_a_hand_computation():
  a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([3.0, 5.0, 7.0])
  va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 3
  t = (a.mean() - b.mean()) / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)  # Welch-Satterthwaite
  from scipy import special
  p = special.betainc(df / 2, 0.5, df / (df + t * t))  # two-sided t tail
  np.testing.assert_allclose(statistics.welch_p(a, b), p, rtol=1e-8)
  assert statistics.welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0
  assert math.isnan(statistics.welch_p([1.0], [1.0, 2.0]))


def test_steps_to_target_and_learning_rate_sensitivity():
  assert statistics.first_step_reaching([100, 200, 300], [0.5, 0.95, 0.85], 0.9) == 200
  assert math.isnan(statistics.first_step_reaching([100, 200], [0.5, 0.6], 0.9))
  # Wortsman et al. eq. 1: mean of min(L, L0) - L*, a diverged (NaN) run counting as L0.
  np.testing.assert_allclose(statistics.lr_sensitivity([0.5, 0.2, float("nan"), 3.0], 1.0),
                             (0.3 + 0.0 + 0.8 + 0.8) / 4)
  assert statistics.lr_sensitivity([0.4, 0.4], 1.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6))
def test_the_bounded_interval_stays_in_range_and_is_the_t_interval_inside_it(values):
  mean, low, high = statistics.bounded_interval(values, 0.0, 1.0)
  assert 0.0 <= low <= mean + 1e-12 and mean - 1e-12 <= high <= 1.0
  centre, half = statistics.interval(values)
  half = 0.0 if math.isnan(half) else half
  assert mean == centre
  assert low == max(centre - half, 0.0) and high == min(centre + half, 1.0)


def test_paired_differences_against_the_t_statistic_by_hand():
  a, b = [0.52, 0.61, 0.70, 0.55, 0.66], [0.10, 0.35, 0.18, 0.21, 0.30]
  differences = np.subtract(a, b)
  n, mean, sd = len(differences), differences.mean(), differences.std(ddof=1)
  t = mean / (sd / np.sqrt(n))
  p = 2 * scipy_stats.t.sf(abs(t), n - 1)
  half = scipy_stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
  assert statistics.paired(a, b) == pytest.approx((mean, half, p, n))
  # A pair with a diverged (non-finite) side is left out; identical arms give p = 1.
  assert statistics.paired(a + [np.nan], b + [0.2])[3] == n
  assert statistics.paired(a, a)[1:3] == (0.0, 1.0)
