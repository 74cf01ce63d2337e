"""Regression through the trainer: the MSE and NMSE against NumPy, tiny runs that write their
metrics, and the config checks of real-valued targets."""

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_check, input_pipeline, logbook, steps, tasks, train, trained
from training_helpers import set_field, tiny_config

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("shape", [(10, 3), (10, 4, 5)])  # per sequence [B, C], per token
def test_mse_and_nmse_against_numpy(shape):
  predictions = RNG.normal(size=shape).astype(np.float32)
  targets = (3.0 + 2.0 * RNG.normal(size=shape)).astype(np.float32)
  loss, measure = steps.objective(jnp.asarray(predictions), jnp.asarray(targets), shape[-1])
  mse = np.mean((predictions.astype(np.float64) - targets) ** 2)
  flat = targets.reshape(-1, shape[-1]).astype(np.float64)
  variance = np.mean(np.mean((flat - flat.mean(0)) ** 2, axis=0))
  np.testing.assert_allclose(loss, mse, rtol=1e-5)
  np.testing.assert_allclose(measure["nmse"], mse / variance, rtol=1e-5)
  # The evaluation's sums over padded batches of 4 (the last padded with weight 0) agree.
  split = tasks.Split(predictions, targets)  # the "model" below returns its inputs
  model = type("Identity", (), {"apply": staticmethod(lambda variables, x: x)})()
  eval_fn = lambda params, batch: steps.eval_step(params, batch, model=model,
                                                  compute_dtype=jnp.float32, num_classes=0)
  metrics = steps.evaluate(eval_fn, {}, input_pipeline.eval_batches(split, 4))
  np.testing.assert_allclose(metrics["eval_loss"], mse, rtol=1e-5)
  np.testing.assert_allclose(metrics["eval_nmse"], mse / variance, rtol=1e-5)
  # Predicting each output's mean scores NMSE 1.
  mean = np.broadcast_to(flat.mean(0), shape).astype(np.float32)
  np.testing.assert_allclose(steps.evaluate(eval_fn, {}, input_pipeline.eval_batches(
      tasks.Split(mean, targets), 4))["eval_nmse"], 1.0, rtol=1e-5)


@pytest.mark.parametrize("task, options", [
    ("multi_retrieval", {"num_retrievals": 2}),  # per sequence, from the CLS token
    ("farthest_point", {"dimension": 4, "length": 6}),  # per token
])
def test_a_tiny_regression_run_writes_mse_and_nmse(task, options, data_dir, tmp_path):
  config = tiny_config(data_dir, task=task, attention_maps=1, num_train_steps=4,
                       **{"model.positional_encoding": "none"})
  config.task_options = {**options, "num_train": 256, "num_test": 40}
  final = train.train_and_evaluate(config, str(tmp_path))
  assert set(final) == {"eval_loss", "eval_nmse"}
  lines = logbook.read(str(tmp_path))
  assert all(np.isfinite(line["nmse"]) and "accuracy" not in line for line in lines
             if "loss" in line)
  assert [line["eval_nmse"] for line in lines if "eval_nmse" in line][-1] == final["eval_nmse"]
  # The final NMSE, recomputed from the trained model's predictions with NumPy.
  run = trained.load(str(tmp_path))
  assert run.task.regression and run.model.config.input_features == run.task.input_features
  predicted = np.asarray(run.model.apply({"params": run.params}, run.task.test.tokens),
                         np.float64)
  targets = run.task.test.labels.astype(np.float64)
  assert predicted.shape == targets.shape
  flat = targets.reshape(-1, targets.shape[-1])
  nmse = np.mean((predicted - targets) ** 2) / np.mean(np.var(flat, axis=0))
  np.testing.assert_allclose(final["eval_nmse"], nmse, rtol=1e-4)
  assert (tmp_path / "replicas" / "seed_0" / "attention_maps" / "example_0.png").exists()


@pytest.mark.parametrize("field, value, message", [
    ("label_smoothing", 0.1, "smooths class labels, but task 'farthest_point' has real-valued "
                             "targets .*; set label_smoothing=0"),
    ("task_options.dimension", 0, "task_options.dimension must be a positive integer, got 0"),
    ("task_options.num_pairs", 2, "not an option of task 'farthest_point'; its options: "),
])
def test_a_malformed_regression_config_names_cause_and_fix(field, value, message, data_dir):
  config = tiny_config(data_dir, task="farthest_point")
  config.task_options = {"num_train": 256, "num_test": 40}
  config.task_options.unlock()
  set_field(config, field, value)
  with pytest.raises(config_check.ConfigError, match=message) as error:
    config_check.validate(config)
  assert "\n" not in str(error.value)
