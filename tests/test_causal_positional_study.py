"""The causal positional study (configs/ablations/positional_causal.py): its arms are what its
docstring says, every mode's predictions can reach alpha with its seeds, and they hold on results
shaped as the literature says and fail where NoPE falls behind by more than the margin."""
import pytest

from configs.ablations import positional_causal as study
from experiments import findings, sweep
from results_helpers import accuracies, write_results

SETS = ["eval"] + [f"length_{low}_{high}" for low, high in study.TEST_LENGTHS]


def _arms(mode):
  config = study.get_config(mode)
  sweep.check(config)
  return config, {name: sweep.variant_config(config, o) for name, o in config.variants}


@pytest.mark.parametrize("mode", ["order", "even_pairs", "randomized"])
def test_every_mode_is_positional_registered_design_with_the_mask_and_read_out_named(mode):
  config, arms = _arms(mode)
  for name, arm in arms.items():
    assert arm.model.causal == ("-causal-" in name)
    assert arm.model.pooling == ("mean" if name.endswith("-mean") else
                                 "last" if arm.model.causal else "cls")
    assert arm.num_train_steps == study.STEPS[arm.task]
    assert (arm.task_options.max_length, arm.model.d_model, arm.batch_size) == (10, 64, 32)
  assert config.num_seeds >= 10 and findings.refusal(study.predictions(mode),
                                                     config.num_seeds) is None
  if mode == "randomized":
    assert [arms[n].model.max_length for n in sorted(arms)] == [640, 80]


def test_the_haviv_pair_differs_only_in_the_mask():
  _, arms = _arms("order")
  bidirectional, causal = (arms[f"order-{kind}-none-mean"].to_dict()
                           for kind in ("bidirectional", "causal"))
  assert bidirectional.pop("model").pop("causal") is False
  assert causal.pop("model").pop("causal") is True
  assert bidirectional == causal


def test_the_accelerator_preset_holds_every_design_in_one_family_that_can_reach_alpha():
  config, arms = _arms("accelerator")
  assert len(arms) == 14 and config.train.task_options.max_length == study.ACCELERATOR[0]
  assert findings.refusal(study.predictions("accelerator"), config.num_seeds) is None


def _records(tmp_path, accuracy):
  """The order mode's results.csv and records, every arm at both rates (1e-3 chosen on the
  validation stream); ``accuracy(arm, test_set, seed)``: 0 the training lengths, 1-3 2x-8x."""
  rows = [(name, seed, rate, "",
           accuracies(**{s: accuracy(name, i, seed) - (rate != 1e-3) * 0.01
                         for i, s in enumerate(SETS)}, validation=0.99 - (rate != 1e-3) * 0.01))
          for name, _ in study.get_config("order").variants for rate in study.LEARNING_RATES
          for seed in range(study.NUM_SEEDS)]
  return {findings.RESULTS: write_results(tmp_path / "results.csv", rows)}


def _held(records):
  return findings.held(findings.decide(study.predictions("order"), records))


def test_the_predictions_hold_on_the_papers_shape_and_fail_beyond_the_margin(tmp_path):

  def papers(lag):  # NoPE behind the encodings by ``lag`` at every test length
    def accuracy(arm, test_set, seed):
      jitter = 0.002 * (seed % 3)
      if arm == "order-bidirectional-none-mean":
        return 0.5 + jitter
      if test_set == 0:
        return 0.99 - jitter
      return 0.8 - 0.05 * test_set - jitter - (lag if arm == "order-causal-none" else 0.0)
    return accuracy

  held = _held(_records(tmp_path, papers(0.03)))  # behind, inside the margin: non-inferior
  assert {name: held[name] for name in ("H1", "H2", "H3", "K1", "K2")} == dict.fromkeys(
      ("H1", "H2", "H3", "K1", "K2"), True)
  held = _held(_records(tmp_path, papers(0.1)))  # behind by twice the margin
  assert (held["K1"], held["H3"]) == (False, True)
