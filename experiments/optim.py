"""AdamW or SGD with momentum (optax), learning rate and weight decay injected per replica; the
schedules; and an optional scale of W_Q's updates (its learning rate times a factor).

The schedules are written with jnp so that their peak and warmup may be traced values: replicas
with different learning rates or warmups share one compiled step (the hyperparameter axis).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "warmup_cosine", "noam")


def warmup_cosine(step, peak, warmup, total):
  """Linear warmup from 0 to ``peak`` over ``warmup`` steps, then cosine decay to 0 at ``total``
  (optax.warmup_cosine_decay_schedule with init_value=0 and end_value=0)."""
  warm = peak * step / jnp.maximum(warmup, 1.0)
  progress = jnp.clip((step - warmup) / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
  return jnp.where(step < warmup, warm, 0.5 * peak * (1.0 + jnp.cos(jnp.pi * progress)))


def noam(step, peak, warmup, total):
  """:ref:`Vaswani et al. (2017) <ref-vaswani2017>`, eq. 3, normalised to peak at ``peak`` after
  warmup:
  lr(step) = peak * min(step / warmup, sqrt(warmup / step))."""
  del total
  step, warmup = jnp.maximum(step, 1.0), jnp.maximum(warmup, 1.0)
  return peak * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))


def constant(step, peak, warmup, total):
  del step, warmup, total
  return peak


def learning_rate(config):
  """The schedule of ``config.schedule`` as fn(step, hparams) -> learning rate of that step."""
  schedule = {"constant": constant, "warmup_cosine": warmup_cosine, "noam": noam}[config.schedule]
  total = float(config.num_train_steps)

  def rate(step, hparams):
    return jnp.asarray(schedule(step.astype(jnp.float32), hparams["learning_rate"],
                                hparams["warmup_steps"], total), jnp.float32)
  return rate


OPTIMIZERS = ("adamw", "sgd")


def query_rate_factor(config):
  """The factor on W_Q's learning rate: ``config.query_lr_scale``, a number or "inv_sqrt"
  (d_k^-1/2, with d_k = model.head_dim or d_model / num_heads); 1 when the config has none.

  >>> import ml_collections
  >>> config = ml_collections.ConfigDict({"query_lr_scale": "inv_sqrt",
  ...     "model": {"head_dim": 64, "d_model": 128, "num_heads": 4}})
  >>> query_rate_factor(config)
  0.125
  """
  factor = config.get("query_lr_scale", 1.0)
  if factor == "inv_sqrt":
    model = config.model
    return float((model.head_dim or model.d_model // model.num_heads) ** -0.5)
  if isinstance(factor, str) or factor <= 0:
    raise ValueError(f"query_lr_scale must be a positive number or 'inv_sqrt', got {factor!r}.")
  return float(factor)


def _query_multiplier(path, leaf, factor):
  """factor on the query projection's entries, kernel and bias ({"query": {"kernel", "bias"}},
  or index 0 of a fused qkv kernel [D_in, 3, N, H] and bias [3, N, H]), 1 elsewhere: the bias
  too, since reparametrising W_Q (q = x W_Q + b_Q) scales both."""
  keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
  if len(keys) < 2 or keys[-1] not in ("kernel", "bias"):
    return 1.0
  if keys[-2] == "query":
    return factor
  if keys[-2] == "qkv":
    return jnp.ones((3,), leaf.dtype).at[0].set(factor)[:, None, None]
  return 1.0


def scale_query_updates(factor):
  """An optax transformation multiplying W_Q's updates (its kernel's and bias's) by ``factor``
  (after the optimiser's learning rate: W_Q's rate times factor, its weight decay included).

  >>> import jax.numpy as jnp
  >>> params = {"query": {"kernel": jnp.ones((2, 1, 2))}, "key": {"kernel": jnp.ones((2, 1, 2))}}
  >>> tx = scale_query_updates(0.5)
  >>> updates, _ = tx.update(params, tx.init(params))
  >>> float(updates["query"]["kernel"][0, 0, 0]), float(updates["key"]["kernel"][0, 0, 0])
  (0.5, 1.0)
  """
  def update(updates, state, params=None):
    del params
    scaled = jax.tree_util.tree_map_with_path(
        lambda path, u: u * _query_multiplier(path, u, factor), updates)
    return scaled, state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def optimizer(config):
  """``config.optimizer`` ("adamw", the default, or "sgd": SGD with ``config.momentum``, 0.9 by
  default, and coupled weight decay: weight_decay x W added to the gradient, carried by the
  momentum) after optional global-norm clipping, W_Q's updates times
  ``query_rate_factor(config)``, with learning_rate and weight_decay injected
  (optax.inject_hyperparams): the train step sets both from the replica's hparams."""
  name = config.get("optimizer", "adamw")
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {name!r}.")
  momentum = float(config.get("momentum", 0.9))
  factor = query_rate_factor(config)

  def transform(learning_rate, weight_decay):
    chain = [optax.clip_by_global_norm(config.grad_clip_norm)] if config.grad_clip_norm else []
    if name == "adamw":
      chain.append(optax.adamw(learning_rate, weight_decay=weight_decay))
    else:
      chain += [optax.add_decayed_weights(weight_decay),
                optax.sgd(learning_rate, momentum=momentum or None)]
    # only when it scales: at 1 the optimiser state is AdamW's as it always was (checkpoints)
    return optax.chain(*chain, *([scale_query_updates(factor)] if factor != 1.0 else []))
  # Placeholders: train_step sets both from the replica's hparams before every update.
  return optax.inject_hyperparams(transform)(learning_rate=0.0, weight_decay=0.0)
