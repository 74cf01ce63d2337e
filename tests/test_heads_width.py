"""The heads-against-width study: every mode a valid sweep, the CPU modes covering each cell once,
a design the sweep's power check accepts, and predictions that hold on Yu et al.'s claim and
fail on its alternatives; findings reads a study's several sweeps as one."""

import os

import numpy as np
import pytest

from configs.ablations import heads_width
from experiments import findings, statistics, study_figures, sweep

RESULTS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "results")


@pytest.mark.parametrize("mode", [*heads_width.MODES, "farthest_point", "quick", "accelerator"])
def test_every_mode_is_a_valid_sweep_of_one_layer(mode):
  config = heads_width.get_config(mode)
  sweep.check(config)
  names = [name for name, _ in config.variants]
  assert all(a in names and b in names for a, b in config.contrasts)
  assert config.train.model.num_layers == 1
  if mode in heads_width.MODES:
    assert config.num_seeds >= 10 and config.train.num_train_steps == heads_width.STEPS
    for name, overrides in config.variants:
      d_model = overrides["model"]["d_model"]
      assert name.startswith(f"d{d_model}_h{overrides['model']['num_heads']}_T")
      assert overrides["model"]["mlp_dim"] == 2 * d_model


def test_the_cpu_modes_run_every_cell_once_and_unknown_modes_are_refused():
  cells = [name for mode in heads_width.MODES
           for name, _ in heads_width.get_config(mode).variants]
  assert sorted(cells) == sorted(heads_width.name(*cell) for cell in heads_width.CPU_CELLS)
  assert len(set(cells)) == len(cells) == 18  # d_model 32 at 4 lengths, 64 at 3, 128 at 2; h 2, 4
  for mode in (None, "fast", "d32_T8"):
    with pytest.raises(ValueError, match="mode must be one of"):
      heads_width.get_config(mode)


@pytest.mark.parametrize("mode", [None, "accelerator"])
def test_every_arm_the_predictions_name_is_one_a_sweep_trains(mode):
  sweeps = ("accelerator", "farthest_point") if mode else (*heads_width.MODES, "farthest_point")
  trained = {name for m in sweeps for name, _ in heads_width.get_config(m).variants}
  declaration = heads_width.predictions(mode)
  named = {argument for _, _, checks in declaration["predictions"] for check in checks
           for argument in check[1:] if isinstance(argument, str)}
  assert named and named <= trained, sorted(named - trained)
  assert set(declaration["measures"]["excess"]["offsets"]) <= trained
  declared = "configs/ablations/heads_width.py" + (":accelerator" if mode else "")
  assert heads_width.get_config(sweeps[0]).predictions == declared  # every CPU mode: one study
  assert {heads_width.get_config(m).predictions for m in heads_width.MODES} == {
      "configs/ablations/heads_width.py"}


@pytest.mark.parametrize("mode", [None, "accelerator"])
def test_the_power_check_accepts_the_seeds_and_refuses_too_few(mode):
  declaration = heads_width.predictions(mode)
  seeds = heads_width.ACCELERATOR[3] if mode else heads_width.NUM_SEEDS
  assert findings.refusal(declaration, seeds) is None
  assert "declare num_seeds" in findings.refusal(declaration, 5)


def _values(nmse_of, cells=heads_width.CPU_CELLS, seeds=heads_width.NUM_SEEDS) -> dict:
  """{arm: {seed: NMSE}} around each cell's mean (and the farthest-point arms), a small spread
  in a different order per arm."""
  offsets = np.linspace(-0.003, 0.003, seeds)
  means = {heads_width.name(*cell): nmse_of(*cell) for cell in cells}
  means.update(nmse_of("fp", None, None))
  return {arm: {s: max(0.0, mean + offsets[(s * 3 + len(arm)) % seeds]) for s in range(seeds)}
          for arm, mean in means.items()}


def _held(nmse_of, keep=lambda check: True) -> dict:
  """Which predictions hold on the study ``nmse_of`` describes, on the checks ``keep`` keeps
  (a TOST takes about a second: the tests keep one or two of each kind)."""
  declaration = heads_width.predictions()
  kept = tuple((name, setting, tuple(filter(keep, checks)))
               for name, setting, checks in declaration["predictions"])
  declaration = {**declaration, "predictions": tuple(p for p in kept if p[2])}
  values = _values(nmse_of)
  decided = findings.decide(declaration, values={"primary": values, "excess": values})
  return findings.held(decided)


def _not_tost(check) -> bool:
  return check[0] != "within"


def _reference(length):
  from experiments import retrieval_reference
  return retrieval_reference.task_reference(2, length)


FARTHEST_WIDTH = {"fp_d48_k48": 0.02, "fp_d48_k16": 0.025, "fp_d16_k16": 0.43}


def _theory(d_model, heads, length):
  """Yu et al.: h = D solves every cell; below D the advantage over the reference is what the
  width buys, a function of d_model / T (the width needed grows in proportion to T)."""
  if d_model == "fp":
    return FARTHEST_WIDTH
  if heads == heads_width.D:
    return 0.002
  return _reference(length) - 0.4 * d_model / (d_model + 2 * length)


def _below_d(nmse_of):
  """The theory, with ``nmse_of(d_model, length)`` in place of its cells below D."""
  def study(d_model, heads, length):
    if d_model == "fp" or heads == heads_width.D:
      return _theory(d_model, heads, length)
    return nmse_of(d_model, length)
  return study


def _two_tosts(check) -> bool:
  return _not_tost(check) or check[1] in ("d64_h4_T32", "fp_d48_k16")


def test_the_predictions_hold_for_yu_et_al_and_fail_for_its_alternatives():
  assert _held(_theory, _two_tosts) == {"W1": True, "W2": True, "W3": True, "F": True}
  # Below D an error that neither T nor the width moves: W2 and W3 fail.
  flat = _below_d(lambda d_model, length: 0.25)
  assert _held(flat, _not_tost) == {"W1": True, "W2": False, "W3": False, "F": True}
  # Below D the width needed does not depend on T (the error rises with T a little): W3 fails.
  by_width = _below_d(lambda d_model, length: 0.5 - 0.4 * d_model / (d_model + 64)
                      + 0.001 * length)
  assert not _held(by_width, _not_tost)["W3"]

  def short(d_model, heads, length):  # four heads of d_model 32 fall short at T = 32, and the
    if d_model == "fp":                # rank matters on farthest_point
      return {**FARTHEST_WIDTH, "fp_d48_k16": 0.43}
    unsolved = heads == heads_width.D and length == 32 and d_model == 32
    return 0.2 if unsolved else _theory(d_model, heads, length)
  assert _held(short, _two_tosts) == {"W1": False, "W2": True, "W3": False, "F": False}


def test_findings_reads_a_study_of_several_sweeps_as_one_and_refuses_an_arm_twice():
  length = os.path.join(RESULTS, "heads_length", "results.csv")
  binding = os.path.join(RESULTS, "heads_binding", "multi_retrieval", "results.csv")
  records, family = findings.read({findings.RESULTS: [length, binding]})
  arms = {record["variant"] for record in records[findings.RESULTS]}
  assert {"h4_T64", "split_4"} <= arms
  rows = {(c.arm, c.baseline) for c in family[findings.RESULTS]}
  assert ("h3_T64", "h4_T64") in rows and ("split_2", "split_1") in rows
  # one family over both sweeps' comparisons: Holm over all of them, as if run as one
  alone = {(c.arm, c.baseline): c.p_adjusted for c in findings.read({"b": binding})[1]["b"]}
  both = {(c.arm, c.baseline): c.p_adjusted for c in family[findings.RESULTS]}
  assert all(both[pair] >= p for pair, p in alone.items())
  assert len(both) > len(alone) and both == {
      (c.arm, c.baseline): c.p_adjusted for c in statistics.adjust(family[findings.RESULTS])}
  with pytest.raises(ValueError, match="in two results files"):
    findings.read({findings.RESULTS: [length, length]})


def test_every_seed_and_offsets_read_as_declared():
  declaration = {"setting": "arms", "measures": {
      "primary": {"column": "eval_nmse"},
      "excess": {"column": "eval_nmse", "offsets": {"a": 0.5}}},
      "predictions": (("P", "", (("below", "a", 0.01, {"every_seed": True}),
                                 ("below", "a", 0.0, {"measure": "excess"}))),)}
  mostly = {"a": {0: 0.001, 1: 0.002, 2: 0.02}}
  (_, _, checks), = findings.decide(declaration, values={"primary": mostly, "excess": mostly})
  assert [held for _, held, _ in checks] == [False, True]
  assert "highest 0.02" in checks[0][2]


def test_the_figure_draws_every_width_against_t_beside_the_reference(tmp_path):
  path = tmp_path / "nmse_by_length.png"
  reference = heads_width.predictions()["measures"]["excess"]["offsets"]
  study_figures.heads_width(_values(_theory), reference, str(path))
  assert os.path.getsize(path) > 10000
