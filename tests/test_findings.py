"""The findings engine: every committed predictions table comes back with the same verdicts and
p values from its results, each kind of check decides as its words say on small synthetic rows,
and a sweep whose design cannot reach its alpha is refused before it trains, in one line."""

import math
import os
import re

import numpy as np
import pytest

from configs.ablations import heads_binding
from experiments import cli, findings, sweep, sweep_report, verdicts

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "docs", "results")

# (config, the table, its results files): every committed predictions*.md.
TABLES = [
    ("scaling_init.py", "scaling_init/predictions.md", "scaling_init/results.csv"),
    ("scaling.py:accelerator", "scaling/predictions_accelerator.md",
     "scaling/accelerator/results.csv"),
    ("attention_variants.py:controls", "attention_variants/controls/predictions.md",
     "attention_variants/controls/results.csv"),
    ("farthest_floor.py", "farthest_floor/predictions.md", "farthest_floor/results.csv"),
    ("heads_length.py", "heads_length/predictions.md", "heads_length/results.csv"),
    ("scale_optimiser.py:adam", "scale_optimiser/predictions_adam.md",
     "scale_optimiser/adam_dk16/results.csv;scale_optimiser/adam_dk64/results.csv"),
    ("scale_optimiser.py:sgd", "scale_optimiser/predictions_sgd.md",
     "scale_optimiser/sgd_dk16/results.csv"),
    ("scale_optimiser.py:sgd_unscaled", "scale_optimiser/predictions_sgd_unscaled.md",
     "scale_optimiser/sgd_unscaled_dk16/results.csv;scale_optimiser/sgd_unscaled_dk64/results.csv"),
    ("scale_optimiser.py:mup", "scale_optimiser/predictions_mup.md",
     "scale_optimiser/mup_dk16/results.csv;scale_optimiser/mup_dk64/results.csv;"
     "scale_optimiser/mup_dk256/results.csv"),
    ("heads_width.py", "heads_width/predictions.md",
     "heads_width/d32/results.csv;heads_width/d64/results.csv;"
     "heads_width/d64_T64_h2/results.csv;heads_width/d64_T64_h4/results.csv;"
     "heads_width/d128_T8/results.csv;heads_width/d128_T32_h2/results.csv;"
     "heads_width/d128_T32_h4/results.csv;"
     "heads_width/farthest_point/results.csv"),
    ("positional_registered.py", "positional_registered/predictions.md",
     "positional_registered/results.csv"),
    ("positional_causal.py:order", "positional_causal/predictions_order.md",
     "positional_causal/order/results.csv"),
    ("positional_causal.py:even_pairs", "positional_causal/predictions_even_pairs.md",
     "positional_causal/even_pairs/results.csv"),
    ("positional_causal.py:randomized", "positional_causal/predictions_randomized.md",
     "positional_causal/randomized/results.csv"),
    ("heads_binding.py:multi_retrieval_accelerator", "heads_binding/predictions_accelerator.md",
     "heads_binding/multi_retrieval_accelerator/results.csv"),
    ("heads_binding.py:multi_retrieval", "heads_binding/predictions.md",
     "multi_retrieval=heads_binding/multi_retrieval_10seeds/results.csv;"
     "farthest_point=heads_binding/farthest_point_10seeds/results.csv"),
    ("heads_binding.py:multi_retrieval", "heads_binding/predictions_5seeds.md",
     "multi_retrieval=heads_binding/multi_retrieval/results.csv;"
     "farthest_point=heads_binding/farthest_point/results.csv"),
]


def _verdicts(text: str) -> list[tuple]:
  """Per row of a predictions table: the check, its p and Holm p as printed, whether it holds
  and whether its prediction held (intervals and means left out)."""
  rows = []
  for line in text.splitlines()[2:]:
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    ps = tuple(re.findall(r"(?:^|[ ;,])((?:TOST )?p [^,;]+|Holm [^,;]+)", cells[3]))
    rows.append((cells[0], cells[2], ps, cells[4], cells[5]))
  return rows


@pytest.mark.parametrize("config, table, results", TABLES, ids=[t[1] for t in TABLES])
def test_the_engine_gives_every_committed_table_its_verdicts_and_p_values(config, table,
                                                                         results):
  declaration = findings.declaration_of(f"configs/ablations/{config}")
  sources = {}  # a source named twice (or unnamed twice): its sweeps, read as one
  for item in results.split(";"):
    name, path = item.split("=") if "=" in item else (findings.RESULTS, item)
    sources.setdefault(name, []).append(os.path.join(RESULTS, path))
  records, family = findings.read(sources)
  made = findings.table(findings.decide(declaration, records, family=family),
                        declaration["setting"])
  with open(os.path.join(RESULTS, table)) as f:
    assert _verdicts(made) == _verdicts(f.read())


def _records(values: dict, column: str = "eval_nmse") -> list[dict]:
  """Records of one learning rate whose ``column`` holds values[arm][seed], their NMSE and
  losses constant."""
  records = []
  for arm, by_seed in values.items():
    seeds = sorted(by_seed)
    metrics = {"seed": seeds, "learning_rate": [1e-3] * len(seeds),
               "eval_nmse": [0.5] * len(seeds), "eval_loss": [0.5] * len(seeds)}
    metrics[column] = [by_seed[s] for s in seeds]
    records.append({"variant": arm, "status": "ok", "metrics": metrics})
  return records


def _decide(values, *checks, alpha=0.05):
  declaration = {"setting": "s", "alpha": alpha, "measures": {"primary": {"column": "eval_nmse"}},
                 "predictions": tuple((f"P{i}", "s", (check,)) for i, check in enumerate(checks))}
  decided = findings.decide(declaration, {findings.RESULTS: _records(values)})
  return [checks[0][1] for _, _, checks in decided]


SEEDS = 8
NOISE = np.linspace(-0.01, 0.01, SEEDS)


def _arms(**means):
  return {arm: {s: mean + NOISE[s] * (1 + s % 3) / 3 for s in range(SEEDS)}
          for arm, mean in means.items()}


def test_above_follows_the_sign_and_the_holm_adjusted_p_and_not_above_is_never_held():
  values = _arms(high=0.5, low=0.1, same=0.1)
  # "not above" without a margin is a null prediction no test can show: at best not tested,
  # and refuted where the arm is shown above.
  assert _decide(values, ("above", "high", "low"), ("above", "low", "high"),
                 ("not_above", "low", "high"), ("not_above", "high", "low")) == [
                     True, False, None, False]
  # 8 seeds: raw p 2/256 in each of 8 comparisons, Holm 0.0625: none shown.
  assert _decide(values, *[("above", "high", "low")] * 8) == [False] * 8
  # unpaired: the permutation test of 8 against 8 seeds
  assert _decide(values, ("above", "high", "low", {"paired": False})) == [True]


def test_within_needs_the_difference_inside_the_margin_by_tost():
  values = _arms(a=0.30, b=0.31, far=0.5)
  assert _decide(values, ("within", "a", "b", 0.05), ("within", "far", "b", 0.05)) == [
      True, False]


def test_times_that_neither_arm_reaches_are_not_measurable_not_equal():
  """Steps to a threshold censored at 1300 in every seed of both arms: a difference of 0 that
  says nothing, so "within" and "above" are untestable there, not held or failed."""
  horizon = 1300.0
  never = dict.fromkeys(range(SEEDS), math.nan)
  values = {"a": never, "b": never, "solved": {s: 200.0 + 10 * s for s in range(SEEDS)}}
  declaration = {"setting": "s", "measures": {"primary": {
      "column": "steps_to_threshold", "read": "steps", "censored_at": horizon}},
      "predictions": (("P0", "s", (("within", "a", "b", 100),)),
                      ("P1", "s", (("above", "a", "b"),)),
                      ("P2", "s", (("above", "a", "solved"),)))}
  records = _records(values, "steps_to_threshold")
  decided = findings.decide(declaration, {findings.RESULTS: records})
  assert [checks[0][1] for _, _, checks in decided] == [None, None, True]
  assert "not measurable" in decided[0][2][0][2]
  assert "| untestable | **not tested** |" in findings.table(decided, "s")


def _rate_records(best: dict, rates=(1e-4, 1e-3, 1e-2), seeds=10) -> list[dict]:
  """Records over a grid of ``rates`` whose validation accuracy peaks, per seed, at the rate
  index best[arm](seed); the other rates tie at 0.5 and are told apart by the loss."""
  records = []
  for arm, index in best.items():
    metrics = {k: [] for k in ("seed", "learning_rate", "validation_accuracy", "validation_loss")}
    for s in range(seeds):
      for i, rate in enumerate(rates):
        metrics["seed"].append(s)
        metrics["learning_rate"].append(rate)
        metrics["validation_accuracy"].append(0.9 if i == index(s) else 0.5)
        metrics["validation_loss"].append(0.1 if i == index(s) else 1.0 - 0.1 * i)
    records.append({"variant": arm, "status": "ok", "metrics": metrics})
  return records


def test_rate_transfers_reads_each_seeds_best_rate_by_friedman_s_test():
  stay = {f"stay{d}": (lambda s: 1 + (s % 4 == 0)) for d in (16, 64, 256)}  # 1 or 2 alike
  move = {f"move{d}": (lambda s, i=i: min(i + (s % 3 == 0), 2))
          for i, d in enumerate((16, 64, 256))}
  declaration = {"setting": "s", "measures": {"primary": {"column": "eval_nmse"}},
                 "predictions": tuple(
                     (f"P{i}", "s", (("rate_transfers", tuple(f"{kind}{d}" for d in (16, 64, 256)),
                                      transfers),))
                     for i, (kind, transfers) in enumerate(
                         (("stay", True), ("stay", False), ("move", True), ("move", False))))}
  decided = findings.decide(declaration, {findings.RESULTS: _rate_records({**stay, **move})})
  assert [checks[0][1] for _, _, checks in decided] == [True, False, False, True]
  # the moving arms' mean index: 0.4, 1.4, 2 (seeds 0, 3, 6, 9 one step up, capped at 2)
  assert "move16 0.4, move64 1.4, move256 2" in decided[3][2][0][2]
  assert "unadjusted" in decided[3][2][0][2] and "Holm" not in decided[3][2][0][2]
  # a diverged run (NaN) never wins, first in its seed's rows or not; a grid with a hole, or
  # two settings, decides nothing
  nan_first = _rate_records({f"stay{d}": (lambda s: 1) for d in (16, 64, 256)})
  for record in nan_first:
    m = record["metrics"]
    order = sorted(range(len(m["seed"])), key=lambda i: -m["learning_rate"][i])
    record["metrics"] = {k: [v[i] for i in order] for k, v in m.items()}
    m = record["metrics"]
    m["validation_accuracy"][0], m["validation_loss"][0] = math.nan, math.nan
  holey = _rate_records({f"stay{d}": (lambda s: 1) for d in (16, 64, 256)})
  for k, v in holey[1]["metrics"].items():
    holey[1]["metrics"][k] = v[1:]
  arms3 = tuple(f"stay{d}" for d in (16, 64, 256))
  for records, arms, expected, words in (
      (nan_first, arms3, True, "stay16 1, stay64 1, stay256 1"),
      (holey, arms3, None, "stay64 at seed 0, rate 0.0001 missing"),
      (nan_first, arms3[:2], None, "2 settings, Friedman's test needs 3")):
    declaration = {**declaration, "predictions": (("P", "s", (("rate_transfers", arms, True),)),)}
    [(_, _, [(_, held, text)])] = findings.decide(declaration, {findings.RESULTS: records})
    assert held is expected and words in text, text


def test_the_rate_transfer_figure_draws_a_panel_per_scale(tmp_path):
  from experiments import study_figures
  records = _rate_records({f"dk{d}_{scale}": (lambda s: 1) for d in (16, 64, 256)
                           for scale in ("inv", "inv_sqrt")})
  study_figures.rate_transfer(None, {findings.RESULTS: records}, str(tmp_path))
  assert (tmp_path / "rate_transfer.png").stat().st_size > 10_000


def test_recovers_half_reads_the_means_and_is_untestable_without_a_gap():
  values = _arms(worse=0.6, better=0.2, most=0.3, little=0.55)
  assert _decide(values, ("recovers_half", "most", "worse", "better"),
                 ("recovers_half", "little", "worse", "better"),
                 ("short_of_half", "little", "worse", "better")) == [True, False, True]
  assert _decide(_arms(worse=0.3, better=0.3, most=0.3),
                 ("recovers_half", "most", "worse", "better")) == [None]


def test_largest_drop_names_the_step_of_the_largest_fall():
  values = _arms(h1=0.8, h2=0.7, h3=0.6, h4=0.05)
  chain = ("h1", "h2", "h3", "h4")
  assert _decide(values, ("largest_drop", chain, 2), ("largest_drop", chain, 0)) == [True, False]


def test_interval_checks_need_the_whole_interval_past_the_level():
  values = _arms(low=0.02, high=0.5, edge=0.1)
  assert _decide(values, ("below", "low", 0.1), ("below", "edge", 0.1),
                 ("above_level", "high", 0.1), ("above_level", "edge", 0.1),
                 ("near_chance", "high", 0.6), ("near_chance", "high", 0.45)) == [
                     True, False, True, False, True, False]


def test_design_checks_read_every_seed_and_the_grid_edges():
  values = _arms(a=0.1)
  records = _records(values)
  for record in records:
    record["metrics"]["eval_accuracy"] = [0.99] * (SEEDS - 1) + [0.9]
  declaration = {"setting": "s", "measures": {"primary": {"column": "eval_nmse"}},
                 "predictions": (("D", "design", (("reaches", "a", 0.95), ("reaches", "a", 0.8),
                                                  ("rates_inside",))),)}
  (_, _, checks), = findings.decide(declaration, {findings.RESULTS: records})
  assert [held for _, held, _ in checks] == [False, True, True]


def test_a_check_whose_arms_were_not_run_waits_and_still_counts_in_the_family():
  """A study run in part (some of its sweeps): a check naming an arm with no results is "not
  run", its prediction not tested, and it counts at p = 1 in Holm's family, so that running
  less never loosens the checks that did run."""
  values = _arms(high=0.5, low=0.1)
  declaration = {"setting": "s", "measures": {"primary": {"column": "eval_nmse"}},
                 "predictions": (("P", "s", (("above", "high", "low"),
                                             ("above", "later", "low"))),)}
  (_, _, (ran, waiting)), = decided = findings.decide(
      declaration, {findings.RESULTS: _records(values)})
  assert waiting[1] is None and waiting[2] == findings.NOT_RUN.format("later")
  assert ran[1] is True and "Holm 0.016 " in ran[2]  # 2/256, doubled by the check not run
  assert findings.outcome(decided[0][2]) is None
  assert "| not run |" in findings.table(decided, "s")
  # a check not run counts only if, run, it would be tested in that family: a level or a
  # design check, or one declared unadjusted, would not
  for kind in (("below", "later", 0.5), ("rate_transfers", ("later", "low", "high"), True)):
    declaration = {**declaration, "predictions": (("P", "s", (("above", "high", "low"), kind)),)}
    (_, _, (ran, _)), = findings.decide(declaration, {findings.RESULTS: _records(values)})
    assert "Holm 0.0078 " in ran[2], kind  # 2/256 alone


def test_an_unknown_kind_is_refused_naming_the_kinds():
  with pytest.raises(ValueError, match="must be one of"):
    _decide(_arms(a=0.1), ("bigger", "a", "a"))


def test_the_heads_binding_accelerator_design_is_refused_before_training(tmp_path, capsys):
  config = heads_binding.get_config("multi_retrieval_accelerator")
  design = verdicts.Design.of_sweep(config, "nmse")
  assert (config.num_seeds, len(design.comparisons), design.test) == (
      8, 7, "paired_permutation")
  assert math.isclose(design.plan(8).smallest_p, 7 * 2 / 256)
  assert design.plan(8).seeds_to_reach == 9
  with pytest.raises(SystemExit) as stopped:
    cli.run_command(sweep.run_sweep, config, str(tmp_path))
  assert stopped.value.code == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "Traceback" not in err, err
  assert "smallest adjusted p 0.055" in err and "needs 9 seeds per arm" in err, err
  assert not os.path.exists(tmp_path / "variants")  # nothing trained
  config.unlock()
  config.num_seeds = 9
  assert verdicts.Design.of_sweep(config, "nmse").refusal(9) is None
  # A declared effect is checked by simulation: 0.1 NMSE at a spread of 0.3 needs more seeds.
  config.effect, config.spread = 0.1, 0.3
  assert "has power" in verdicts.Design.of_sweep(config, "nmse").refusal(9)


def test_a_quick_smoke_test_declares_no_alpha_and_is_not_refused():
  config = heads_binding.get_config("multi_retrieval_quick")
  assert config.alpha is None
  assert verdicts.Design.of_sweep(config, "nmse").refusal(config.num_seeds) is None


# Every study that declares predictions, in each mode that names them.
DECLARED = [("scaling", "accelerator"), ("scaling_init", None), ("scaling_init", "accelerator"),
            ("attention_variants", "accelerator"), ("attention_variants", "controls"),
            ("farthest_floor", None), ("farthest_floor", "accelerator"),
            ("heads_binding", "multi_retrieval"), ("heads_binding", "farthest_point"),
            ("heads_binding", "multi_retrieval_accelerator"), ("heads_length", None),
            ("heads_length", "accelerator"), ("positional", "accelerator"),
            ("positional_registered", None)]


def _named_arms(check) -> set[str]:
  """The arms a check names (its string and tuple-of-string arguments)."""
  names = set()
  for argument in check[1:]:
    if isinstance(argument, str):
      names.add(argument)
    elif isinstance(argument, tuple):
      names.update(argument)
  return names


@pytest.mark.parametrize("study, mode", DECLARED)
def test_every_arm_a_prediction_names_is_one_the_sweep_trains(study, mode):
  import importlib
  module = importlib.import_module(f"configs.ablations.{study}")
  config = module.get_config(mode)
  declaration = findings.declaration_of(config.predictions)
  trained = {name for name, _ in config.variants}
  if study == "heads_binding" and mode != "multi_retrieval_accelerator":  # two sweeps, one table
    trained |= {name for name, _ in module.get_config("farthest_point").variants}
    trained |= {name for name, _ in module.get_config("multi_retrieval").variants}
  derived = {arm for measure in declaration["measures"].values()
             for arm in measure.get("differences", {})}
  named = {arm for _, _, checks in declaration["predictions"] for check in checks
           for arm in _named_arms(check)}
  assert named and named <= trained | derived, sorted(named - trained - derived)
  assert all(check[0] in findings.KINDS for _, _, checks in declaration["predictions"]
             for check in checks)


def test_predictions_that_cannot_reach_alpha_are_refused_naming_the_seeds():
  # 10 tested checks (its five "not above" checks, declared without a margin, test nothing)
  declaration = heads_binding.predictions("multi_retrieval")
  line = findings.refusal(declaration, 5)
  assert "smallest possible adjusted p 0.31" in line and "num_seeds = 8" in line, line
  assert findings.refusal(declaration, 8) is None
  # the accelerator study's eight checks: its two TOSTs reach 7 / 256 at 8 seeds
  assert findings.refusal(heads_binding.predictions("multi_retrieval_accelerator"), 8) is None


def test_a_check_that_asks_a_row_of_the_study_s_family_reads_that_row_and_its_holm_p():
  """One question, one family: split_8 - split_1 is in the study's family of 7 comparisons at 8
  seeds (Holm 0.055), so "split_1 > split_8" does not hold, whatever the predictions' own
  family would say; a check outside the study's family is corrected over the other checks."""
  path = os.path.join(RESULTS, "heads_binding/multi_retrieval_accelerator/results.csv")
  records, family = findings.read({findings.RESULTS: path})
  declaration = {"setting": "s", "measures": {"primary": {"column": "eval_nmse"}},
                 "predictions": (("A", "s", (("above", "split_1", "split_8"),
                                             ("above", "split_2", "split_8"))),)}
  ((_, _, (in_family, other)),) = findings.decide(declaration, records, family=family)
  row = next(c for c in family[findings.RESULTS] if (c.arm, c.baseline) == ("split_8", "split_1"))
  assert row.p_adjusted > 0.05 and in_family[1] is False
  assert f"Holm {row.p_adjusted:.2g} {findings.STUDY_FAMILY}" in in_family[2]
  assert other[1] is True and findings.OTHER_CHECKS in other[2]
