"""Config-driven training of the attention_jax encoder classifier.

  python -m experiments.train --config=configs/default.py --workdir=/tmp/run [--config.seed=1]

``train_and_evaluate(config, workdir)`` is the importable entry (Colab calls it directly). A run
writes config.json, metrics.jsonl, TensorBoard events and checkpoints to its workdir, and resumes
from the latest checkpoint when started again with the same command.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import attention_jax as aj
from experiments import checkpoints as checkpoints_lib
from experiments import config_check
from experiments import input_pipeline
from experiments import logbook
from experiments import optim
from experiments import tasks


class NonFiniteError(RuntimeError):
  """A non-finite loss or gradient norm stopped the run."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw uint32 key; the dropout key of a step is fold_in(rng, step)


def encoder_config(config, task: tasks.Task) -> aj.EncoderConfig:
  model = config.model
  return aj.EncoderConfig(
      vocab_size=task.vocab_size, d_model=model.d_model, num_heads=model.num_heads,
      num_layers=model.num_layers, mlp_dim=model.mlp_dim,
      max_length=max(model.max_length, task.max_length),
      positional_encoding=model.positional_encoding,
      attention_scale=config_check.attention_scale(model.attention_scale),
      dropout_rate=model.dropout_rate, attention_dropout_rate=model.attention_dropout_rate,
      pre_layer_norm=model.pre_layer_norm, attention_impl=model.attention_impl or None,
      pad_id=task.pad_id, num_classes=task.num_classes, pooling=model.pooling)


def _cast(params, dtype):
  return jax.tree.map(lambda p: p.astype(dtype), params)


def cross_entropy(logits, labels, num_classes, label_smoothing=0.0):
  """Per-example loss [B] and correctness [B] from logits [B, C] and labels [B]."""
  targets = jax.nn.one_hot(labels, num_classes)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
  return loss, (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def train_step(state, batch, *, model, tx, config, num_classes):
  """One optimizer step: (state, batch) -> (state, metrics). Pure; jitted once."""
  dropout_rng = jax.random.fold_in(state.rng, state.step)
  dtype = jnp.dtype(config.compute_dtype)

  def loss_fn(params):
    logits = model.apply({"params": _cast(params, dtype)}, batch["tokens"],
                         deterministic=False, rngs={"dropout": dropout_rng})
    loss, correct = cross_entropy(logits, batch["labels"], num_classes, config.label_smoothing)
    return jnp.mean(loss), jnp.mean(correct)

  (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                            opt_state=opt_state)
  return new_state, {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}


def eval_step(params, batch, *, model, config, num_classes):
  """Sums of loss, correct predictions and weight over a (padded) batch."""
  logits = model.apply({"params": _cast(params, jnp.dtype(config.compute_dtype))},
                       batch["tokens"])
  loss, correct = cross_entropy(logits, batch["labels"], num_classes)
  weight = batch["weight"]
  return {"loss": jnp.sum(loss * weight), "correct": jnp.sum(correct * weight),
          "count": jnp.sum(weight)}


def evaluate(eval_fn, params, split, batch_size, sharding=None, prefix="eval") -> dict:
  """Mean loss and accuracy over a split; arrays [S] when ``eval_fn`` is vmapped over S seeds."""
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  for batch in input_pipeline.eval_batches(split, batch_size):
    batch = input_pipeline.shard(batch, sharding) if sharding is not None else batch
    sums = jax.device_get(eval_fn(params, batch))
    totals = {name: totals[name] + np.asarray(sums[name], np.float64) for name in totals}
  metrics = {f"{prefix}_loss": totals["loss"] / totals["count"],
             f"{prefix}_accuracy": totals["correct"] / totals["count"]}
  return {name: value.tolist() for name, value in metrics.items()}  # floats or lists


def itstime(step: int, every: int, total: int) -> bool:
  """Whether something done every ``every`` steps (and at the last step) is due at ``step``."""
  return step % every == 0 or step == total


def due(step: int, config) -> tuple[bool, bool, bool]:
  """(log, evaluate, checkpoint): which of the config's periodic tasks fall on ``step``."""
  return tuple(itstime(step, every, config.num_train_steps) for every in (
      config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps))


@jax.jit
def first_non_finite(first_bad, metrics, step):
  """The first step whose loss or gradient norm was not finite, 0 while there is none.

  Runs on the device, so that the loop needs the metrics on the host only when it logs.
  """
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
  return jnp.where((first_bad == 0) & ~finite, step, first_bad)


def initial_state(model, tx, task, seed) -> TrainState:
  """The step-0 state of seed ``seed`` (an int, or a traced one under vmap)."""
  rng = jax.random.PRNGKey(seed)
  init_rng, dropout_rng = jax.random.split(rng)
  tokens = jnp.zeros((1, task.max_length), jnp.int32)
  params = model.init(init_rng, tokens)["params"]
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                    rng=dropout_rng)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains and evaluates the model that ``config`` describes; returns the final eval metrics."""
  config_check.validate(config, jax.device_count())
  config_check.claim_workdir(config, workdir, config_check.RESUMABLE)

  task = tasks.load_task(config.task, dict(config.task_options), config.data_dir)
  model = aj.SequenceClassifier(encoder_config(config, task))
  tx, schedule = optim.optimizer(config)

  mesh = Mesh(np.array(jax.devices()), ("data",))
  replicated = NamedSharding(mesh, PartitionSpec())
  data_sharding = NamedSharding(mesh, PartitionSpec("data"))
  state = jax.device_put(initial_state(model, tx, task, config.seed), replicated)
  checkpoints = checkpoints_lib.Checkpoints(workdir, config.keep_checkpoints)
  restored = checkpoints.restore(state)
  state = state if restored is None else restored
  start_step = int(state.step)

  step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, config=config,
                                      num_classes=task.num_classes),
                    out_shardings=(replicated, replicated), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=model, config=config,
                                      num_classes=task.num_classes), out_shardings=replicated)
  batches = input_pipeline.TrainBatches(task.train, config.batch_size, config.seed)
  log = logbook.Logbook(workdir, resume_step=start_step)
  tokens_per_step = config.batch_size * task.max_length
  progress = tqdm.tqdm(total=config.num_train_steps, initial=start_step, mininterval=2.0,
                       desc=os.path.basename(os.path.normpath(workdir)), file=sys.stdout)
  last_saved, eval_metrics = checkpoints.latest_step(), {}
  first_bad = jax.device_put(jnp.zeros((), jnp.int32), replicated)
  started = time.perf_counter()
  for step in range(start_step + 1, config.num_train_steps + 1):
    # Nothing in this loop waits for the device except at log, eval and checkpoint steps: the
    # host prepares the next batch while the step runs.
    state, metrics = step_fn(state, input_pipeline.shard(batches.batch(step - 1), data_sharding))
    first_bad = first_non_finite(first_bad, metrics, state.step)
    progress.update(1)
    log_now, eval_now, save_now = due(step, config)
    bad_step = int(first_bad) if log_now or eval_now or save_now else 0  # waits for the device
    if bad_step:
      log.close()
      raise NonFiniteError(
          f"non-finite loss or gradient norm at step {bad_step}; the last good checkpoint "
          f"is step {last_saved}. Try a lower learning_rate, grad_clip_norm > 0, or "
          "compute_dtype='float32'.")
    if log_now:
      metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
      throughput = tokens_per_step * (step - start_step) / (time.perf_counter() - started)
      log.write(step, {**metrics, "learning_rate": float(schedule(step - 1))},
                extra={"tokens_per_second": throughput})
      progress.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}",
                           tok_s=f"{throughput:.0f}", refresh=False)
    if eval_now:
      eval_metrics = evaluate(eval_fn, state.params, task.test, config.batch_size, data_sharding)
      log.write(step, eval_metrics)
      progress.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                  eval_metrics.items()))
    if save_now:
      checkpoints.save(step, state)
      last_saved = step
  progress.close()
  checkpoints.close()
  log.close()
  if not eval_metrics:  # resumed a finished run
    eval_metrics = evaluate(eval_fn, state.params, task.test, config.batch_size, data_sharding)
  if config.attention_maps:
    from experiments import attention_maps  # matplotlib only when maps are asked for
    attention_maps.write(model, state.params, task, config.attention_maps,
                         os.path.join(workdir, "attention_maps"))
  print("final: " + json.dumps({"step": int(state.step), **eval_metrics}))
  return eval_metrics


def main():
  from absl import flags, logging
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", "configs/default.py", "Path to a config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and figures.",
                      required=True)
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host).")

  def run(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    if flags.FLAGS.distributed:
      jax.distributed.initialize()
    try:
      train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
    except config_check.ConfigError as error:
      sys.exit(f"config error: {error}")
    except NonFiniteError as error:
      sys.exit(f"training stopped: {error}")

  config_check.run_app(run)


if __name__ == "__main__":
  main()
