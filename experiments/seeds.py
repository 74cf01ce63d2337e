"""Several seeds of one config trained at once: ``jax.vmap`` over the seed, one compiled program.

Seed i of ``train_seeds(config, workdir, num_seeds)`` is seed ``config.seed + i``: its own
initialisation, dropout keys and data order, the same as ``train.train_and_evaluate`` with that
seed. The stacked state is checkpointed like a single run's, so an interrupted group resumes, and
each seed writes its own metrics.jsonl (and TensorBoard events) to <workdir>/seed_<seed>/.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import attention_jax as aj
from experiments import checkpoints as checkpoints_lib
from experiments import config_check
from experiments import input_pipeline
from experiments import logbook
from experiments import optim
from experiments import probes
from experiments import tasks
from experiments import train as train_lib


def _stack(batches):
  return {name: np.stack([batch[name] for batch in batches]) for name in batches[0]}


def seed_dir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed_{seed}")


def train_seeds(config, workdir: str, num_seeds: int, extra_evals: dict | None = None) -> dict:
  """Trains seeds config.seed .. config.seed + num_seeds - 1 together; returns, per seed (lists of
  length num_seeds), the final metrics, the probe summaries at initialisation ("init_*") and at the
  end ("final_*"), and "seconds", the wall time of the whole group.

  ``extra_evals`` maps a name to task-option overrides of an additional test set (for example
  {"long": {"max_length": 64}}), reported as <name>_accuracy and <name>_loss.
  """
  config_check.validate(config, 1)
  started = time.perf_counter()
  config_check.claim_workdir(config, workdir, config_check.RESUMABLE)
  task = tasks.load_task(config.task, dict(config.task_options), config.data_dir)
  model = aj.SequenceClassifier(train_lib.encoder_config(config, task))
  extra_tests = {}
  for name, overrides in (extra_evals or {}).items():
    extra = tasks.load_task(config.task, {**dict(config.task_options), **dict(overrides)},
                            config.data_dir)
    if extra.max_length > model.config.max_length:
      raise config_check.ConfigError(
          f"the '{name}' evaluation has sequences of length {extra.max_length} but the model "
          f"supports {model.config.max_length}; set model.max_length >= {extra.max_length}.")
    extra_tests[name] = extra.test
  tx, _ = optim.optimizer(config)
  seeds = [config.seed + i for i in range(num_seeds)]

  probe_batch = next(input_pipeline.eval_batches(task.test, config.batch_size))
  probe_fn = jax.jit(jax.vmap(lambda params: probes.summary(
      model, params, probe_batch["tokens"], probe_batch["labels"], task.num_classes)))
  def probe(prefix, params):
    return {f"{prefix}_{name}": np.asarray(value).tolist()
            for name, value in jax.device_get(probe_fn(params)).items()}

  init_fn = jax.jit(jax.vmap(lambda seed: train_lib.initial_state(model, tx, task, seed)))
  state = init_fn(jnp.array(seeds))
  init_probes = probe("init", state.params)  # recomputed the same way after a resume
  checkpoints = checkpoints_lib.Checkpoints(workdir, config.keep_checkpoints)
  restored = checkpoints.restore(state)
  state = state if restored is None else restored
  start_step = int(state.step[0])

  step_fn = jax.jit(jax.vmap(functools.partial(
      train_lib.train_step, model=model, tx=tx, config=config, num_classes=task.num_classes)),
      donate_argnums=0)
  eval_fn = jax.jit(jax.vmap(functools.partial(
      train_lib.eval_step, model=model, config=config, num_classes=task.num_classes),
      in_axes=(0, None)))
  batches = [input_pipeline.TrainBatches(task.train, config.batch_size, seed) for seed in seeds]
  logs = [logbook.Logbook(seed_dir(workdir, seed), resume_step=start_step) for seed in seeds]
  def evaluate_all(params):
    metrics = train_lib.evaluate(eval_fn, params, task.test, config.batch_size)
    for name, split in extra_tests.items():
      metrics.update(train_lib.evaluate(eval_fn, params, split, config.batch_size, prefix=name))
    return metrics
  def log(step, metrics):
    for index, seed_log in enumerate(logs):
      seed_log.write(step, {name: float(values[index]) for name, values in metrics.items()})

  eval_metrics = {}
  first_bad = jnp.zeros((num_seeds,), jnp.int32)  # per seed; see train_lib.first_non_finite
  try:
    for step in range(start_step + 1, config.num_train_steps + 1):
      state, metrics = step_fn(state, _stack([b.batch(step - 1) for b in batches]))
      first_bad = train_lib.first_non_finite(first_bad, metrics, state.step)
      log_now, eval_now, save_now = train_lib.due(step, config)
      if log_now or eval_now or save_now:  # the only steps that wait for the device
        bad = {seed: int(at) for seed, at in zip(seeds, jax.device_get(first_bad)) if at}
        if bad:
          raise train_lib.NonFiniteError(
              f"non-finite loss or gradient norm at step {min(bad.values())} for seeds "
              f"{sorted(bad)}; the last checkpoint is step {checkpoints.latest_step()}. Try a "
              "lower learning_rate or grad_clip_norm > 0.")
      if log_now:
        log(step, {name: np.asarray(value) for name, value in jax.device_get(metrics).items()})
      if eval_now:
        eval_metrics = evaluate_all(state.params)
        log(step, eval_metrics)
      if save_now:
        checkpoints.save(step, state)
  finally:
    checkpoints.close()
    for seed_log in logs:
      seed_log.close()
  if not eval_metrics:  # resumed a finished group
    eval_metrics = evaluate_all(state.params)
  return {"seed": seeds, **eval_metrics, **init_probes, **probe("final", state.params),
          "seconds": [time.perf_counter() - started] * num_seeds}
