"""The pure pieces of training: state, loss, one train step, one eval step, evaluation, cadence.

Nothing here knows about replicas, devices or disks: the loop (experiments/train.py) vmaps these
functions over its leading replica axis and shards them. This module imports nothing else from
experiments/, so anything (probes, scripts, tests) may import it.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

# Hyperparameters that may differ between the replicas of one compiled program: each replica
# carries its own values in TrainState.hparams (float32 scalars, a leading replica axis when
# stacked).
HYPERPARAMETERS = ("learning_rate", "weight_decay", "warmup_steps")


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw uint32 key; the dropout key of a step is fold_in(rng, step)
  hparams: dict   # {name in HYPERPARAMETERS: scalar}


def cast(params, dtype):
  return jax.tree.map(lambda p: p.astype(dtype), params)


def cross_entropy(logits, labels, num_classes, label_smoothing=0.0):
  """Per-example loss [B] and correctness [B] from logits [B, C] and labels [B]."""
  targets = jax.nn.one_hot(labels, num_classes)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
  return loss, (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def initial_state(model, tx, max_length: int, seed, hparams: dict) -> TrainState:
  """The step-0 state of one replica (seed and hparams may be traced, under vmap)."""
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
  params = model.init(init_rng, jnp.zeros((1, max_length), jnp.int32))["params"]
  hparams = {name: jnp.asarray(hparams[name], jnp.float32) for name in HYPERPARAMETERS}
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                    rng=dropout_rng, hparams=hparams)


def train_step(state, batch, *, model, tx, learning_rate, compute_dtype, label_smoothing,
               num_classes):
  """One optimizer step of one replica: (state, batch) -> (state, metrics).

  ``tx`` is an ``optax.inject_hyperparams`` optimizer whose learning rate and weight decay are
  set here from the replica's own hparams; ``learning_rate(step, hparams)`` is the schedule.
  """
  dropout_rng = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params):
    logits = model.apply({"params": cast(params, compute_dtype)}, batch["tokens"],
                         deterministic=False, rngs={"dropout": dropout_rng})
    loss, correct = cross_entropy(logits, batch["labels"], num_classes, label_smoothing)
    return jnp.mean(loss), jnp.mean(correct)

  (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  rate = learning_rate(state.step, state.hparams)
  opt_state = state.opt_state._replace(hyperparams={
      **state.opt_state.hyperparams, "learning_rate": rate,
      "weight_decay": state.hparams["weight_decay"]})
  updates, opt_state = tx.update(grads, opt_state, state.params)
  new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                            opt_state=opt_state)
  return new_state, {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads),
                     "learning_rate": rate}


def eval_step(params, batch, *, model, compute_dtype, num_classes):
  """Sums of loss, correct predictions and weight over a (padded) batch."""
  logits = model.apply({"params": cast(params, compute_dtype)}, batch["tokens"])
  loss, correct = cross_entropy(logits, batch["labels"], num_classes)
  weight = batch["weight"]
  return {"loss": jnp.sum(loss * weight), "correct": jnp.sum(correct * weight),
          "count": jnp.sum(weight)}


def evaluate(eval_fn, params, batches, prefix="eval") -> dict:
  """Mean loss and accuracy over ``batches``: floats, or lists [R] when ``eval_fn`` is vmapped
  over R replicas."""
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  for batch in batches:
    sums = jax.device_get(eval_fn(params, batch))
    totals = {name: totals[name] + np.asarray(sums[name], np.float64) for name in totals}
  metrics = {f"{prefix}_loss": totals["loss"] / totals["count"],
             f"{prefix}_accuracy": totals["correct"] / totals["count"]}
  return {name: value.tolist() for name, value in metrics.items()}


def itstime(step: int, every: int, total: int) -> bool:
  """Whether something done every ``every`` steps (and at the last step) is due at ``step``."""
  return step % every == 0 or step == total


def due(step: int, config) -> tuple[bool, bool, bool]:
  """(log, evaluate, checkpoint): which of the config's periodic tasks fall on ``step``."""
  return tuple(itstime(step, every, config.num_train_steps) for every in (
      config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps))


@jax.jit
def first_non_finite(first_bad, metrics, step):
  """The first step whose loss or gradient norm was not finite, 0 while there is none
  (elementwise over replicas). Runs on the device, so that the loop needs the metrics on the
  host only when it logs."""
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
  return jnp.where((first_bad == 0) & ~finite, step, first_bad)
