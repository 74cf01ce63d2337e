"""The intervals cover what they claim at the seeds studies have, and a study that cannot find a
large effect is refused before it runs: 95% intervals simulated at 5, 8 and 10 seeds, from normal
and from bimodal data (two well-separated modes, as solved and stuck seeds give), cover the true
mean 93-97% of the time; a planted effect in an 8-seed design is found, or the design is refused
by the power check, naming the seeds it needs."""

import numpy as np
import pytest

from experiments import statistics

pytestmark = pytest.mark.quick

SIMULATIONS = 6000  # a coverage of 0.95 is read to +-0.0028 (one standard error)


def _normal(rng, size):
  return rng.normal(0.0, 1.0, size)


def _bimodal(rng, size):  # modes at -1 and +1 (sd 0.25 each), mean 0
  return np.where(rng.random(size) < 0.5, -1.0, 1.0) + rng.normal(0.0, 0.25, size)


@pytest.mark.parametrize("draw", [_normal, _bimodal])
@pytest.mark.parametrize("n", [5, 8, 10])
def test_the_interval_of_a_mean_covers_95_percent(draw, n):
  # A paired comparison's interval is this one, of the per-seed differences.
  rng = np.random.default_rng(n)
  samples = draw(rng, (SIMULATIONS, n))
  covered = [low <= 0.0 <= high for _, low, high in map(statistics.mean_interval, samples)]
  assert 0.93 <= np.mean(covered) <= 0.97, np.mean(covered)


@pytest.mark.parametrize("draw, scale", [(_normal, 3.0), (_bimodal, 1.0)])
@pytest.mark.parametrize("n", [5, 8, 10])
def test_the_interval_of_an_independent_difference_covers_95_percent(draw, scale, n):
  # Welch's interval; normal arms with a 3x larger spread in one, bimodal arms alike.
  rng = np.random.default_rng(100 + n)
  a = draw(rng, (SIMULATIONS // 4, n))
  b = scale * draw(rng, (SIMULATIONS // 4, n)) + 1.0
  covered = [low <= -1.0 <= high
             for _, low, high in map(statistics.difference_interval, a, b)]
  assert 0.93 <= np.mean(covered) <= 0.97, np.mean(covered)


def test_the_percentile_bootstrap_this_replaces_under_covers_at_5_seeds():
  """The calibration can fail: the interval the engine used before covers ~83% at 5 seeds."""
  from scipy import stats
  rng = np.random.default_rng(0)
  covered = []
  for sample in _normal(rng, (400, 5)):
    interval = stats.bootstrap((sample,), np.mean, method="percentile", n_resamples=999,
                               rng=rng).confidence_interval
    covered.append(interval.low <= 0.0 <= interval.high)
  assert np.mean(covered) < 0.9


def test_a_planted_effect_in_an_8_seed_design_is_found_or_the_design_refused():
  # 1000x lower NMSE in one arm of 8 seeds, 7 comparisons: the exact sign-flip test cannot
  # pass Holm (7 * 2/256 = 0.055), so the plan refuses it and names 9 seeds ...
  refused = statistics.plan("paired_permutation", 8, 7)
  assert not refused.reachable and refused.smallest_p == pytest.approx(7 * 2 / 256)
  assert refused.seeds_to_reach == 9 and "needs 9 seeds per arm" in refused.problem()
  # ... and at the 9 seeds it names the planted effect is found.
  rng = np.random.default_rng(0)
  baseline = rng.uniform(0.05, 0.2, (7, 9))
  arms = baseline * rng.uniform(0.9, 1.1, (7, 9))
  arms[0] /= 1000.0
  found = statistics.adjust(statistics.paired_difference("nmse", f"arm{i}", "base", arms[i],
                                                         baseline[i]) for i in range(7))
  assert found[0].p_adjusted < statistics.SIGNIFICANT and found[0].estimate < 0
  assert statistics.plan("paired_permutation", 9, 7).reachable
  # an unpaired 8-seed design with 7 comparisons can reach it: 7 * 2 / C(16, 8) = 0.001
  assert statistics.plan("permutation", 8, 7).reachable


def test_power_by_simulation_matches_the_normal_theory_of_the_sign_flip_test():
  """At 12 seeds the exact sign-flip test has nearly the t test's power (Pitman efficiency ~1
  for normal data): power for effect = spread at alpha 0.05 is 0.91-0.93 by the noncentral t."""
  from scipy import stats
  simulated = statistics.power("paired_permutation", 12, 1, effect=1.0, spread=1.0,
                               simulations=2000)
  critical = stats.t.ppf(0.975, 11)
  theory = stats.nct.sf(critical, 11, np.sqrt(12)) + stats.nct.cdf(-critical, 11, np.sqrt(12))
  assert abs(simulated - theory) < 0.04, (simulated, theory)
  # no effect: the share of rejections is the test's size
  assert statistics.power("paired_permutation", 12, 1, effect=0.0, spread=1.0,
                          simulations=2000) == pytest.approx(0.05, abs=0.015)


def test_a_declared_effect_names_the_seeds_for_80_percent_power():
  plan = statistics.plan("paired_permutation", 8, 2, effect=1.0, spread=1.0, simulations=500)
  assert plan.reachable and not plan.powered
  assert plan.seeds_for_power is not None and plan.seeds_for_power > 8
  assert f"needs {plan.seeds_for_power} seeds" in plan.problem()
  assert statistics.power("paired_permutation", plan.seeds_for_power, 2, 1.0, 1.0,
                          simulations=500) >= statistics.POWER
  assert statistics.power("paired_permutation", plan.seeds_for_power - 1, 2, 1.0, 1.0,
                          simulations=500) < statistics.POWER
  solve = statistics.plan("solve_rate", 10, 1, effect=0.9, base_rate=0.1, simulations=500)
  assert solve.powered and solve.problem() == ""
  with pytest.raises(ValueError, match="needs base_rate"):
    statistics.plan("solve_rate", 10, 1, effect=0.5)
