"""The statistics engine against independent references: exact tests enumerated by hand, Wilson's
interval from its formula, Holm's procedure from its definition; ties and zero variance give
defined results and no warnings."""

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from experiments import statistics

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick


def _sign_flip_by_enumeration(differences):
  """Two-sided p: the share of the 2^n sign patterns whose |mean| is at least the observed."""
  observed = abs(np.mean(differences))
  means = [abs(np.mean(np.array(signs) * differences))
           for signs in itertools.product((1, -1), repeat=len(differences))]
  return np.mean(np.array(means) >= observed - 1e-12)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=8),
       st.lists(st.floats(-1, 1, allow_nan=False), min_size=8, max_size=8))
def test_the_paired_test_is_the_exact_sign_flip_test(a, b):
  b = b[:len(a)]
  c = statistics.paired_difference("m", "a", "b", a, b)
  differences = np.array(a) - np.array(b)
  assert c.n == len(a) and c.test == "paired_permutation"
  assert c.estimate == pytest.approx(differences.mean())
  assert c.p == pytest.approx(_sign_flip_by_enumeration(differences)
                              if np.any(differences != 0) else 1.0)
  assert c.low <= c.estimate + 1e-12 and c.estimate - 1e-12 <= c.high
  if np.ptp(differences) > 0:  # the t interval of the differences
    _, low, high = statistics.mean_interval(differences)
    assert (c.low, c.high) == pytest.approx((low, high))


def test_wilson_interval_matches_its_formula():
  z = 1.959963984540054
  for k, n in ((0, 3), (2, 3), (7, 10), (10, 10)):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    rate, low, high = statistics.rate_interval(k, n)
    assert rate == p
    assert low == pytest.approx(max(0.0, centre - half)) and high == pytest.approx(
        min(1.0, centre + half))


def test_fisher_exact_by_enumerating_the_hypergeometric_tables():
  # 5 of 5 solved against 0 of 5: of the C(10, 5) = 252 ways to place 5 solves, 2 are as extreme.
  c = statistics.solve_rate_difference("solved", "a", "b", [True] * 5, [False] * 5)
  assert c.p == pytest.approx(2 / 252) and c.estimate == 1.0
  assert -1.0 <= c.low <= c.estimate <= c.high <= 1.0
  same = statistics.solve_rate_difference("solved", "a", "b", [True, False] * 3, [False, True] * 3)
  assert same.p == 1.0 and same.estimate == 0.0


def test_holm_by_its_definition():
  ps = [0.01, 0.04, 0.03, 0.005, float("nan")]
  adjusted = [c.p_adjusted for c in statistics.adjust(
      statistics.Comparison("m", "a", "b", 5, 0, 0, 0, p, "t") for p in ps)]
  # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made monotone: 0.02, 0.03, 0.06, 0.06
  np.testing.assert_allclose(adjusted[:4], [0.03, 0.06, 0.06, 0.02])
  assert math.isnan(adjusted[4])


def test_ties_and_zero_variance_are_defined_and_silent():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert statistics.mean_interval([0.578] * 5) == (0.578, 0.578, 0.578)
    zero = statistics.paired_difference("m", "a", "b", [0.5] * 4, [0.5] * 4)
    assert (zero.estimate, zero.low, zero.high, zero.p) == (0.0, 0.0, 0.0, 1.0)
    shifted = statistics.paired_difference("m", "a", "b", [1.0] * 6, [0.5] * 6)
    assert (shifted.estimate, shifted.low, shifted.high) == (0.5, 0.5, 0.5)
    assert shifted.p == pytest.approx(2 / 64)
    both = statistics.independent_difference("m", "a", "b", [0.5] * 4, [0.5] * 3)
    assert both.p == 1.0 and both.estimate == 0.0
    constant = statistics.independent_difference("m", "a", "b", [1.0] * 4, [0.0] * 4)
    assert constant.p == pytest.approx(2 / 70) and constant.low == constant.high == 1.0
    never = statistics.time_to_solve_difference("t", "a", "b", [math.nan] * 3, [math.nan] * 3,
                                                horizon=100, paired=False)
    assert never.p == 1.0 and never.estimate == 0.0


@pytest.mark.parametrize("values, lower, upper", [
    ([0.0001, 0.0002, 0.0009], 0.0, math.inf), ([0.5, 1.0, 1.0], 0.0, 1.0),
    ([0.4, 0.5, 0.6, 0.55], 0.0, 1.0)])
def test_mean_intervals_stay_inside_the_range_and_hold_the_mean(values, lower, upper):
  mean, low, high = statistics.mean_interval(values, lower, upper)
  assert lower <= low <= mean <= high <= upper
  assert mean == pytest.approx(np.mean(values))


@pytest.mark.parametrize("test", ["paired_permutation", "permutation", "solve_rate",
                                  "time_to_solve"])
@pytest.mark.parametrize("n", [3, 5, 6])
def test_smallest_p_is_what_the_most_extreme_outcome_gives(test, n):
  if test == "solve_rate":
    p = statistics.solve_rate_difference("s", "a", "b", [True] * n, [False] * n).p
  elif test == "time_to_solve":
    p = statistics.time_to_solve_difference("t", "a", "b", [100.0] * n, [math.nan] * n,
                                            horizon=1000, paired=True).p
  elif test == "permutation":  # exact while 9999 resamples cover every split (n <= 6)
    p = statistics.independent_difference("m", "a", "b", np.arange(n) + 10.0, np.arange(n)).p
  else:
    p = statistics.paired_difference("m", "a", "b", np.arange(n) + 1.0, np.zeros(n)).p
  assert statistics.smallest_p(test, n) == pytest.approx(p)
  assert statistics.smallest_p(test, n, family=4) == pytest.approx(min(1.0, 4 * p))


def test_time_to_solve_unpaired_is_the_log_rank_test_of_the_censored_times():
  from scipy import stats
  a, b = [100.0, 200.0, math.nan, 300.0], [math.nan, 400.0, math.nan]
  c = statistics.time_to_solve_difference("t", "x", "y", a, b, horizon=1000, paired=False)
  expected = stats.logrank(stats.CensoredData(uncensored=[100, 200, 300], right=[1000]),
                           stats.CensoredData(uncensored=[400], right=[1000, 1000]))
  assert c.test == "logrank" and c.p == pytest.approx(expected.pvalue)
  assert c.estimate == pytest.approx(np.mean([100, 200, 1000, 300]) - np.mean([1000, 400, 1000]))


def test_equivalence_needs_the_seeds_to_show_it():
  rng = np.random.default_rng(0)
  base = rng.uniform(0.9, 1.0, 12)
  close = base + rng.normal(0, 0.005, 12)
  assert statistics.equivalence(close, base, margin=0.05) < 0.01
  assert statistics.equivalence(close[:4], base[:4], margin=0.05) >= 0.05  # 4 seeds cannot
  assert statistics.equivalence(close[:5], base[:5], margin=0.05) == 1 / 32  # 5 can
  assert statistics.equivalence(base + 0.2, base, margin=0.05) > 0.5
  unpaired = statistics.equivalence(close[:6], base[6:], margin=0.2, paired=False)
  assert unpaired == pytest.approx(1 / math.comb(12, 6), rel=0.2)  # every split inside


def _one_sided_by_enumeration(differences):
  """p that the mean of the differences exceeds 0: the share of sign patterns at least as high."""
  means = [np.mean(np.array(signs) * differences)
           for signs in itertools.product((1, -1), repeat=len(differences))]
  return np.mean(np.array(means) >= np.mean(differences) - 1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=5, max_size=8),
       st.floats(0.05, 1.0), st.booleans())
def test_tost_is_two_one_sided_tests_and_its_90_interval_lies_inside_the_margin_iff_it_passes(
    differences, margin, paired):
  differences = np.array(differences)
  a, b = differences, np.zeros_like(differences) if paired else -differences[::-1] / 2
  c = statistics.equivalence_test("m", "x", "y", a, b, margin, paired=paired)
  assert c.margin == margin and c.level == pytest.approx(0.9) and c.is_equivalence
  if paired:
    assert c.test == "tost_paired" and c.p == pytest.approx(max(
        _one_sided_by_enumeration(differences + margin),
        _one_sided_by_enumeration(margin - differences)))
  assert c.low <= c.estimate + 1e-9 and c.estimate - 1e-9 <= c.high
  inside = -margin < c.low and c.high < margin
  boundary = min(abs(c.low + margin), abs(c.high - margin)) < 1e-9
  assert boundary or inside == (c.p < statistics.SIGNIFICANT)


def test_tost_on_steps_counts_a_never_solved_seed_at_the_horizon():
  solved = [200.0, 300.0, 200.0, 200.0, 300.0, 200.0]
  same = statistics.equivalence_test("steps", "x", "y", solved, solved[::-1], 150,
                                     horizon=1000)
  assert same.p == pytest.approx(1 / 64) and -150 < same.low <= same.high < 150
  stuck = statistics.equivalence_test("steps", "x", "y", solved[:5] + [math.nan], solved, 150,
                                      horizon=1000)
  assert stuck.estimate == pytest.approx(800 / 6) and stuck.p >= 0.05 and stuck.high > 150


def test_welch_interval_by_its_formula():
  from scipy import stats
  a, b = np.array([0.2, 0.5, 0.4, 0.9]), np.array([0.1, 0.15, 0.12, 0.1, 0.2])
  va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 5
  df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)
  half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
  estimate, low, high = statistics.difference_interval(a, b)
  assert (low, high) == pytest.approx((estimate - half, estimate + half))
  c = statistics.independent_difference("m", "x", "y", a, b)
  assert (c.low, c.high) == pytest.approx((low, high))
  cut = statistics.independent_difference("eval_accuracy", "x", "y", a, b, lower=0, upper=1)
  assert cut.high == pytest.approx(high) and cut.low >= -1


def test_a_comparisons_row_reads_back_old_and_new():
  new = statistics.Comparison("m", "a", "b", 5, 0.1, 0.0, 0.2, 0.03, "tost_paired", 0.06, 0.1,
                              statistics.MATCHED)
  row = {name: str(getattr(new, name)) for name in statistics.Comparison.FIELDS}
  assert statistics.Comparison.of_row(row) == new
  old = {k: v for k, v in row.items() if k not in ("margin", "rate")}
  read = statistics.Comparison.of_row(old)
  assert read.rate == statistics.CHOSEN and math.isnan(read.margin)


def test_first_step_reaching_either_way():
  assert statistics.first_step_reaching([100, 200, 300], [0.5, 0.9, 1.0], 0.9) == 200
  assert math.isnan(statistics.first_step_reaching([100, 200], [0.4, 0.2], 0.1,
                                                   higher_is_better=False))
  assert statistics.first_step_reaching([100, 200], [0.4, 0.05], 0.1,
                                        higher_is_better=False) == 200


def test_lr_sensitivity_is_wortsman_eq_1():
  assert statistics.lr_sensitivity([0.5, 0.2, float("nan")], 1.0) == pytest.approx(1.1 / 3)
  assert statistics.lr_sensitivity([0.3, 0.3], 1.0) == 0.0


def test_an_unknown_test_is_refused_in_one_line_wherever_one_is_named():
  for call in (lambda test: statistics.smallest_p(test, 0),
               lambda test: statistics.plan(test, 5, 1),
               lambda test: statistics.power(test, 5, 1, 0.1)):
    with pytest.raises(ValueError, match=r"^test must be one of \('paired_permutation', "
                                         r".*\), got 't_test'\.$"):
      call("t_test")
