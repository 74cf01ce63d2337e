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

from attention_jax import variants

# Hyperparameters that may differ between the replicas of one compiled program: each replica
# carries its own values in TrainState.hparams (float32 scalars, a leading replica axis when
# stacked).
HYPERPARAMETERS = ("learning_rate", "weight_decay", "warmup_steps")
# An evaluation's measure of success, by the kind of target (classes, real values), and whether
# higher is better.
MEASURES = {"accuracy": True, "nmse": False}


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  rng: jax.Array  # raw uint32 key; the dropout key of a step is fold_in(rng, step)
  hparams: dict   # {name in HYPERPARAMETERS: scalar}
  # The step whose loss or gradient norm was not finite, 0 while there is none; from then on the
  # replica's params and optimizer state stay frozen at their last finite values.
  diverged_at: jax.Array


class NonFiniteError(RuntimeError):
  """Every replica's loss or gradient norm was non-finite: the run stopped."""


def cast(params, dtype):
  return jax.tree.map(lambda p: p.astype(dtype), params)


def cross_entropy(logits, labels, num_classes, label_smoothing=0.0):
  """Loss, correctness and weight per target: logits [B, C] with labels [B] (one target per
  sequence), or [B, T, C] with [B, T] (one per position); a negative label carries no target
  (weight 0, loss 0)."""
  weight = (labels >= 0).astype(jnp.float32)
  targets = jax.nn.one_hot(jnp.maximum(labels, 0), num_classes)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets) * weight
  return loss, (jnp.argmax(logits, -1) == labels).astype(jnp.float32) * weight, weight


def mean_over_targets(values, weight):
  """The mean of per-target ``values`` over the targets that carry weight (0 when none do)."""
  return jnp.sum(values) / jnp.maximum(jnp.sum(weight), 1.0)


def is_regression(labels) -> bool:
  """Whether ``labels`` are real values (float: a regression task) rather than class ids."""
  return jnp.issubdtype(labels.dtype, jnp.floating)


def squared_error(predictions, targets):
  """(y_hat - y)^2 per target value, float32: [B, C] or [B, T, C] -> the same shape."""
  return jnp.square(predictions.astype(jnp.float32) - targets.astype(jnp.float32))


def target_variance(targets):
  """The variance of each of the C outputs over every other axis, averaged over C: [..., C] -> []
  (the mean squared error of predicting each output's mean)."""
  return jnp.mean(jnp.var(targets.reshape(-1, targets.shape[-1]), axis=0))


def objective(outputs, labels, num_classes, label_smoothing=0.0):
  """The loss of a batch and its measure of success: cross-entropy and {"accuracy"} for classes
  (int labels), mean squared error and {"nmse"} (MSE / the batch's target variance) for real
  values (float labels [B(, T), C], outputs of the same shape)."""
  if is_regression(labels):
    loss = jnp.mean(squared_error(outputs, labels))
    return loss, {"nmse": loss / target_variance(labels)}
  loss, correct, weight = cross_entropy(outputs, labels, num_classes, label_smoothing)
  return mean_over_targets(loss, weight), {"accuracy": mean_over_targets(correct, weight)}


def example_inputs(config, length: int):
  """A batch of one zero input of ``length``: token ids [1, T], or vectors [1, T, F]."""
  if config.input_features is None:
    return jnp.zeros((1, length), jnp.int32)
  return jnp.zeros((1, length, config.input_features), jnp.float32)


def initial_state(model, tx, max_length: int, seed, hparams: dict, start=None) -> TrainState:
  """The step-0 state of one replica (seed and hparams may be traced, under vmap); ``start``
  (anchor, noise) sets the parameters to anchor + noise x the random initialisation."""
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
  params = model.init(init_rng, example_inputs(model.config, max_length))["params"]
  if start is not None:
    anchor, noise = start
    params = jax.tree.map(lambda a, p: jnp.asarray(a, p.dtype) + noise * p, anchor, params)
  hparams = {name: jnp.asarray(hparams[name], jnp.float32) for name in HYPERPARAMETERS}
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                    rng=dropout_rng, hparams=hparams, diverged_at=jnp.array(0, jnp.int32))


def train_step(state, batch, *, model, tx, learning_rate, compute_dtype, label_smoothing,
               num_classes):
  """One optimizer step of one replica: (state, batch) -> (state, metrics).

  ``tx`` is an ``optax.inject_hyperparams`` optimizer whose learning rate and weight decay are
  set here from the replica's own hparams; ``learning_rate(step, hparams)`` is the schedule.
  A step with a non-finite loss or gradient norm marks the replica diverged (``diverged_at``) and
  is not applied, nor is any later one, so the other replicas of a grid train on.
  """
  dropout_rng = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params):
    logits, sown = model.apply({"params": cast(params, compute_dtype)}, batch["tokens"],
                               deterministic=False, rngs={"dropout": dropout_rng},
                               mutable=variants.LOSSES)
    loss, measure = objective(logits, batch["labels"], num_classes, label_smoothing)
    # plus the layers' auxiliary losses (MoH's load balancing), 0 for the other models
    return loss + variants.auxiliary_loss(sown), measure

  (loss, measure), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grad_norm = optax.tree.norm(grads)
  rate = learning_rate(state.step, state.hparams)
  opt_state = state.opt_state._replace(hyperparams={
      **state.opt_state.hyperparams, "learning_rate": rate,
      "weight_decay": state.hparams["weight_decay"]})
  updates, opt_state = tx.update(grads, opt_state, state.params)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  healthy = finite & (state.diverged_at == 0)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(healthy, n, o), new, old)
  new_state = state.replace(
      step=state.step + 1,
      params=keep(optax.apply_updates(state.params, updates), state.params),
      opt_state=keep(opt_state, state.opt_state),
      diverged_at=jnp.where((state.diverged_at == 0) & ~finite, state.step + 1,
                            state.diverged_at))
  return new_state, {"loss": loss, **measure, "grad_norm": grad_norm, "learning_rate": rate}


def eval_step(params, batch, *, model, compute_dtype, num_classes):
  """Sums over the targets of a (padded) batch: of loss, correct predictions and weight; or, for
  real targets [B(, T), C], of squared error and values, and per output the targets and their
  squares [C] (from which ``evaluate`` takes the variance)."""
  outputs = model.apply({"params": cast(params, compute_dtype)}, batch["tokens"])
  labels = batch["labels"]
  if is_regression(labels):
    loss = squared_error(outputs, labels)  # [B(, T), C]
    rows = batch["weight"].reshape(batch["weight"].shape + (1,) * (loss.ndim - 1))
    per_output = lambda x: jnp.sum((x * rows).reshape(-1, x.shape[-1]), axis=0)  # [C]
    return {"loss": jnp.sum(loss * rows), "count": jnp.sum(jnp.ones_like(loss) * rows),
            "target_sum": per_output(labels), "target_square_sum": per_output(labels ** 2)}
  loss, correct, weight = cross_entropy(outputs, labels, num_classes)
  # [B] or [B, T]: padding rows of the last batch count for nothing (loss and correct already
  # carry the per-target weight)
  rows = batch["weight"].reshape(batch["weight"].shape + (1,) * (weight.ndim - 1))
  return {"loss": jnp.sum(loss * rows), "correct": jnp.sum(correct * rows),
          "count": jnp.sum(weight * rows)}


def normalised_mse(totals) -> np.ndarray:
  """NMSE = MSE / the variance of the targets (each output's, averaged over the C outputs), from
  eval_step's sums (leading replica axes allowed): 1 for predicting each output's mean."""
  values = totals["count"] / totals["target_sum"].shape[-1]  # per output
  mean = totals["target_sum"] / values[..., None]
  variance = np.mean(totals["target_square_sum"] / values[..., None] - mean ** 2, axis=-1)
  return totals["loss"] / totals["count"] / variance


def evaluate(eval_fn, params, batches, prefix="eval") -> dict:
  """Mean loss and accuracy (or, for real targets, NMSE) over ``batches``: floats, or lists [R]
  when ``eval_fn`` is vmapped over R replicas."""
  totals = {}
  for batch in batches:
    sums = jax.device_get(eval_fn(params, batch))
    totals = {name: totals.get(name, 0.0) + np.asarray(value, np.float64)
              for name, value in sums.items()}
  metrics = {f"{prefix}_loss": totals["loss"] / totals["count"]}
  if "correct" in totals:
    metrics[f"{prefix}_accuracy"] = totals["correct"] / totals["count"]
  else:
    metrics[f"{prefix}_nmse"] = normalised_mse(totals)
  return {name: value.tolist() for name, value in metrics.items()}


def itstime(step: int, every: int, total: int) -> bool:
  """Whether something done every ``every`` steps (and at the last step) is due at ``step``."""
  return step % every == 0 or step == total


def due(step: int, config) -> tuple[bool, bool, bool]:
  """(log, evaluate, checkpoint): which of the config's periodic tasks fall on ``step``."""
  return tuple(itstime(step, every, config.num_train_steps) for every in (
      config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps))
