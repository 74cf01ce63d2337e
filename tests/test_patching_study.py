"""experiments.patching_study: the per-seed patching numbers and the predictions' tests."""

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from experiments import oracles, patching_study
from training_helpers import four_maxima_config, oracle_run


def test_patching_a_head_from_itself_moves_nothing_and_from_a_donor_moves_its_output():
  model = aj.SequenceClassifier(aj.EncoderConfig(vocab_size=8, d_model=16, num_heads=2,
                                                 num_layers=1, mlp_dim=16, num_classes=3,
                                                 dropout_rate=0.0))
  tokens = jnp.array([[1, 2, 3, 4], [5, 6, 7, 1]])
  variables = model.init(jax.random.key(0), tokens)
  clean, same = patching_study.head_effects(model, variables, tokens, tokens)
  np.testing.assert_allclose(same, np.broadcast_to(clean, same.shape), atol=1e-6)
  _, patched = patching_study.head_effects(model, variables, tokens, tokens[::-1])
  assert patching_study.effect_matrix(clean, patched).min() > 0


def test_slopes_recover_a_head_that_carries_its_maximum():
  rng = np.random.default_rng(0)
  clean_target, donor_target = rng.normal(size=(2, 64, 2))
  clean_output = clean_target
  patched = np.stack([clean_output.copy(), clean_output.copy()])  # [N, B, D]
  patched[0, :, 0] = donor_target[:, 0]  # head 0 carries maximum 0
  patched[1, :, 1] = 0.5 * donor_target[:, 1] + 0.5 * clean_target[:, 1]  # head 1 half of 1
  share = np.eye(2)
  on, off = patching_study.slopes(clean_output, patched, clean_target, donor_target, share)
  np.testing.assert_allclose(on, 0.75, atol=1e-9)
  np.testing.assert_allclose(off, 0.0, atol=1e-9)


def test_verdicts_reject_when_effect_and_probe_disagree():
  rows = [{"agreeing": 0, "slope_on": 0.1 * s, "slope_off": 0.5 + 0.01 * s, "heads": 4, "maxima": 4}
          for s in range(10)]
  assert not any(v["holds"] for v in patching_study.verdicts(rows).values())


def test_the_oracle_of_multi_retrieval_has_each_head_carry_its_own_maximum(data_dir):
  config = four_maxima_config(data_dir)
  run, _ = oracle_run(config, oracles.multi_retrieval, config.task_options.to_dict())
  numbers = patching_study.seed_numbers(run, 128)
  assert numbers["agreeing"] == 4 and (numbers["heads"], numbers["maxima"]) == (4, 4)
  assert abs(numbers["slope_on"] - 1) < 0.1 and abs(numbers["slope_off"]) < 0.1
