"""A study's verdicts: the declared comparisons only, learning rates chosen on validation, the
design carried by results.csv, and the whole pipeline calibrated: arms whose labels are
exchangeable give a false positive in about 5% of studies or fewer, a planted effect is found."""

import dataclasses
import math
import os

import numpy as np
import pytest

from experiments import statistics, sweep_report, verdicts

pytestmark = pytest.mark.quick

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "results")


def _record(variant, accuracy, seeds=8, rates=(1e-3, 3e-3), steps=None):
  """A finished variant; accuracy(rate, seed) -> (test, validation)."""
  metrics = {k: [] for k in ("name", "seed", "learning_rate", "weight_decay", "warmup_steps",
                             "diverged_at", "eval_accuracy", "eval_loss", "validation_accuracy",
                             "validation_loss", "seconds", verdicts.STEPS_TO)}
  for rate in rates:
    for seed in range(seeds):
      test, validation = accuracy(rate, seed)
      for key, value in (("name", f"seed_{seed}-lr_{rate:g}"), ("seed", seed),
                         ("learning_rate", rate), ("weight_decay", 0.0), ("warmup_steps", 10.0),
                         ("diverged_at", 0), ("eval_accuracy", test), ("eval_loss", 1 - test),
                         ("validation_accuracy", validation),
                         ("validation_loss", 1 - validation), ("seconds", 1.0),
                         (verdicts.STEPS_TO, steps(rate, seed) if steps else math.nan)):
        metrics[key].append(value)
  return {"variant": variant, "status": "ok", "overrides": {"arm": variant}, "metrics": metrics}


def _design(names, test="paired_permutation", baseline="base"):
  return verdicts.Design(baseline=baseline, comparisons=tuple((n, baseline) for n in names
                                                              if n != baseline),
                         test=test, primary="eval_accuracy", solved_at=0.9, censored_at=1100.0)


def test_rates_are_chosen_on_validation_and_edges_flagged():
  # The test set would pick 1e-3 for "a"; its validation stream picks 3e-3, the grid's edge.
  a = _record("a", lambda rate, seed: {3e-4: (0.6, 0.6), 1e-3: (0.9, 0.5)}.get(rate, (0.6, 0.7)),
              rates=(3e-4, 1e-3, 3e-3))
  b = _record("b", lambda rate, seed: (0.8, 0.8) if rate == 1e-3 else (0.5, 0.5),
              rates=(3e-4, 1e-3, 3e-3))
  chosen = {c.variant: c for c in verdicts.choose([a, b], "accuracy")}
  assert (chosen["a"].learning_rate, chosen["a"].edge) == (3e-3, "highest")
  assert (chosen["b"].learning_rate, chosen["b"].edge) == (1e-3, "")
  assert chosen["a"].chosen_on == "validation"


def test_a_primary_read_on_a_longer_test_set_is_chosen_for_on_its_validation_twin():
  # Every rate is at 1.0 on the training lengths (validation_accuracy); the validation stream's
  # length_41_80 prefers 1e-3, while the training-length tie-break (loss) would prefer 3e-3.
  def arm(name):
    record = _record(name, lambda rate, seed: (1.0, 1.0), rates=(1e-3, 3e-3))
    metrics, rates = record["metrics"], record["metrics"]["learning_rate"]
    metrics["validation_loss"] = [0.1 if r == 3e-3 else 0.2 for r in rates]
    metrics["validation_length_41_80_accuracy"] = [0.9 if r == 1e-3 else 0.7 for r in rates]
    metrics["validation_length_41_80_loss"] = [0.3] * len(rates)
    return record
  design = dataclasses.replace(_design(["base"]), primary="length_41_80_accuracy")
  (chosen,) = verdicts.choose([arm("base")], "accuracy", design)
  assert (chosen.learning_rate, chosen.chosen_on) == (1e-3, "validation_length_41_80")
  # without the twin (results from before it): the training lengths, the tie broken by the loss
  old = arm("base")
  del old["metrics"]["validation_length_41_80_accuracy"]
  (chosen,) = verdicts.choose([old], "accuracy", design)
  assert (chosen.learning_rate, chosen.chosen_on) == (3e-3, "validation")


def test_only_the_declared_comparisons_are_made_against_the_declared_reference():
  records = [_record(name, lambda rate, seed, d=d: (0.6 + d + 0.01 * seed, 0.6 + d))
             for name, d in (("base", 0.0), ("x", 0.3), ("y", 0.35))]
  design = _design(["base", "x", "y"])
  comparisons = verdicts.compare(verdicts.choose(records, "accuracy"), design)
  assert [(c.arm, c.baseline) for c in comparisons] == [("x", "base"), ("y", "base")]
  assert all(c.p_adjusted == pytest.approx(min(1, 2 * c.p)) or c.p_adjusted >= c.p
             for c in comparisons)
  assert [verdicts.verdict(c, design) for c in comparisons] == ["better", "better"]


def test_arms_that_see_different_data_are_compared_unpaired():
  # Seed s of two arms at different task lengths saw different batches: no pairs, the
  # permutation test; arms that differ only in the model stay paired, from a run's nested
  # overrides or a CSV's flat ones alike.
  def arm(name, overrides, shift):
    record = _record(name, lambda rate, seed: (0.6 + shift + 0.01 * seed, 0.6 + shift))
    return {**record, "overrides": overrides}
  records = [arm("short", {"task_options": {"length": 8}, "model": {"num_heads": 1}}, 0.0),
             arm("long", {"task_options": {"length": 64}, "model": {"num_heads": 1}}, 0.2),
             arm("wide", {"task_options.length": 8, "model.num_heads": 4}, 0.2)]
  design = verdicts.Design(baseline="short", comparisons=(("long", "short"), ("wide", "short")),
                           test="paired_permutation", primary="eval_accuracy", solved_at=0.9,
                           censored_at=1100.0)
  long, wide = verdicts.compare(verdicts.choose(records, "accuracy"), design)
  assert (long.test, wide.test) == ("permutation", "paired_permutation")
  assert long.p < 0.01 and wide.p == pytest.approx(2 / 2 ** 8)
  # A study that declares the unpaired test gets it for every comparison.
  unpaired = verdicts.compare(verdicts.choose(records, "accuracy"),
                              dataclasses.replace(design, test="permutation"))
  assert [c.test for c in unpaired] == ["permutation", "permutation"]


def test_a_planted_effect_in_an_8_seed_study_is_detected_and_no_other_arm():
  rng = np.random.default_rng(1)
  noise = rng.normal(0, 0.05, (4, 2, 8))
  def study(effect):
    return [_record(name, lambda rate, seed, i=i: (
        min(1.0, 0.7 + noise[i, int(rate == 3e-3), seed] + (effect if name == "planted" else 0)),
        0.7 + noise[i, int(rate == 3e-3), seed] / 2)) for i, name in enumerate(
            ("base", "planted", "other", "third"))]
  design = _design(["base", "planted", "other", "third"])
  found = verdicts.compare(verdicts.choose(study(0.25), "accuracy"), design)
  assert found[0].arm == "planted" and found[0].p_adjusted < 0.05
  assert all(c.p_adjusted >= 0.05 for c in found[1:])


def test_results_csv_carries_the_design_and_provenance(tmp_path):
  records = [_record(n, lambda rate, seed: (0.9, 0.9), seeds=3) for n in ("base", "x")]
  records[0]["provenance"] = {"commit": "abc1234", "date": "2026-11-26"}
  records[1]["provenance"] = {"commit": "abc1234", "date": "2026-11-26"}
  design = _design(["base", "x"], test="solve_rate")
  path = tmp_path / "results.csv"
  sweep_report.write_csv(records, path, design)
  again, read_design = sweep_report.read_csv(path)
  assert read_design == design
  assert again[0]["provenance"]["commit"] == "abc1234"
  paths = sweep_report.write_from_csv(str(path))
  with open(paths["comparisons"]) as f:
    header, row, matched = f.read().splitlines()
  assert header == "metric,arm,baseline,n,estimate,low,high,p,p_adjusted,test,margin,rate"
  assert row.startswith("solved,x,base,3,0.0,") and row.endswith(",nan,chosen")
  assert matched.startswith("solved,x,base,3,0.0,")
  assert matched.endswith(",nan,solve_rate,nan,matched")
  report = open(paths["markdown"]).read()
  assert "commit abc1234" in report and "cannot reach p < 0.05" in report
  assert "no difference detected (3 seeds)" in report


def _exchangeable(records, rng):
  """The records with their arm labels permuted within each (seed, learning rate)."""
  shuffled = [{**r, "metrics": {k: list(v) for k, v in r["metrics"].items()}} for r in records]
  first = records[0]["metrics"]
  for index in range(len(first["seed"])):
    order = rng.permutation(len(records))
    for target, source in zip(shuffled, order):
      for name, values in records[source]["metrics"].items():
        target["metrics"][name][index] = values[index]
  return shuffled


@pytest.mark.parametrize("test", ["paired_permutation", "time_to_solve"])
def test_exchangeable_arms_of_a_committed_study_rarely_give_a_false_positive(test):
  """The heads study (10 seeds, 6 head counts, 4 learning rates), arms permuted within each seed
  and rate, run through the whole pipeline (rates chosen on validation, the declared tests,
  Holm): the share of studies with any adjusted p < 0.05 stays at 5% or below."""
  records, design = sweep_report.read_csv(os.path.join(RESULTS, "heads", "results.csv"))
  assert all(len(set(r["metrics"]["seed"])) >= 8 for r in records)
  design = verdicts.Design(**{**design.__dict__, "test": test})
  rng = np.random.default_rng(0)
  trials, any_significant, raw = 200, 0, []
  for _ in range(trials):
    comparisons = verdicts.compare(verdicts.choose(_exchangeable(records, rng), "accuracy"),
                                   design)
    any_significant += any(c.p_adjusted < statistics.SIGNIFICANT for c in comparisons)
    raw += [c.p for c in comparisons]
  share = any_significant / trials
  assert share <= 0.05 + 2.5 * math.sqrt(0.05 * 0.95 / trials), share
  # The raw tests are alive, not stuck at p = 1: their p values spread over [0, 1].
  assert 0.01 < np.mean(np.array(raw) < 0.05) < 0.1


def _steps_study(solve_at):
  """Two arms over rates 1e-3 and 3e-3, 10 seeds; solve_at(variant, rate) -> (test steps,
  validation steps, final validation accuracy)."""
  records = []
  for name in ("base", "wide"):
    record = _record(name, lambda rate, seed, n=name: (0.95, solve_at(n, rate)[2]), seeds=10,
                     steps=lambda rate, seed, n=name: solve_at(n, rate)[0] + 10 * seed)
    record["metrics"][verdicts.VALIDATION_STEPS_TO] = [
        solve_at(name, rate)[1] + 10 * seed for rate, seed in zip(
            record["metrics"]["learning_rate"], record["metrics"]["seed"])]
    records.append(record)
  return records


def test_a_time_to_threshold_study_chooses_rates_for_time_and_reports_a_matched_rate():
  # base: 1e-3 solves sooner on validation (200 against 500 steps) though 3e-3 ends more
  # accurate; wide: 3e-3 sooner. The final accuracy would choose 3e-3 for both.
  table = {("base", 1e-3): (200, 200, 0.95), ("base", 3e-3): (500, 500, 0.99),
           ("wide", 1e-3): (400, 400, 0.95), ("wide", 3e-3): (100, 100, 0.99)}
  records = _steps_study(lambda name, rate: table[name, rate])
  design = dataclasses.replace(_design(["base", "wide"]), test="time_to_solve")
  by_accuracy = {c.variant: c.learning_rate for c in verdicts.choose(records, "accuracy")}
  assert by_accuracy == {"base": 3e-3, "wide": 3e-3}
  chosen = verdicts.choose(records, "accuracy", design)
  assert {c.variant: c.learning_rate for c in chosen} == {"base": 1e-3, "wide": 3e-3}
  assert chosen[0].chosen_for == verdicts.TIME_TO_THRESHOLD
  rows = verdicts.compare_both(chosen, design)
  assert [(c.rate, c.estimate) for c in rows] == [("chosen", -100.0), ("matched", 200.0)]
  assert math.isfinite(rows[0].p_adjusted) and math.isnan(rows[1].p_adjusted)
  assert verdicts.verdict(rows[0], design) == "better"
  assert verdicts.verdict(rows[1], design) == "worse (p unadjusted)"
  # records from before the validation column: chosen for the final measure, and said so
  old = [{**r, "metrics": {k: v for k, v in r["metrics"].items()
                           if k != verdicts.VALIDATION_STEPS_TO}} for r in records]
  assert {c.learning_rate for c in verdicts.choose(old, "accuracy", design)} == {3e-3}


def test_a_matched_row_needs_the_reference_s_rate_in_the_arm_s_grid():
  base = _record("base", lambda rate, seed: (0.7 + 0.01 * seed, 0.7), rates=(1e-3,))
  other = _record("x", lambda rate, seed: (0.8 + 0.01 * seed, 0.8), rates=(3e-3,))
  chosen = verdicts.choose([base, other], "accuracy")
  assert verdicts.compare_matched(chosen, _design(["base", "x"])) == []


def test_verdict_words_are_never_stronger_than_their_test():
  design = _design(["base", "x"])
  row = lambda **kw: statistics.Comparison(**{**dict(  # noqa: E731
      metric="eval_accuracy", arm="x", baseline="base", n=8, estimate=0.01, low=-0.02,
      high=0.03, p=0.01, test="paired_permutation", p_adjusted=0.2), **kw})
  assert verdicts.verdict(row(), design) == "no difference detected (8 seeds)"
  assert verdicts.verdict(row(p_adjusted=0.01), design) == "better"
  equivalent = row(test="tost_paired", margin=0.05, p=0.01, p_adjusted=0.03)
  assert verdicts.verdict(equivalent, design) == "same (within ±0.05)"
  assert verdicts.verdict(row(test="tost_paired", margin=0.05, p=0.01, p_adjusted=0.07),
                          design) == "equivalence not shown (8 seeds)"
  assert "same" not in verdicts.verdict(row(p=0.9, p_adjusted=0.9), design)


@pytest.mark.parametrize("study", sorted(
    name for name in os.listdir(RESULTS) if os.path.exists(os.path.join(RESULTS, name,
                                                                        "comparisons.csv"))))
def test_committed_comparisons_read_back_as_chosen_rows(study):
  rows = sweep_report.read_comparisons(os.path.join(RESULTS, study, "comparisons.csv"))
  assert rows and all(c.rate in (statistics.CHOSEN, statistics.MATCHED) for c in rows)
  records, design = sweep_report.read_csv(os.path.join(RESULTS, study, "results.csv"))
  if design is not None and records:
    assert all(verdicts.verdict(c, design) for c in rows)
