"""AdamW (optax) with its learning rate and weight decay injected per replica, and the schedules.

The schedules are written with jnp so that their peak and warmup may be traced values: replicas
with different learning rates or warmups share one compiled step (the hyperparameter axis).
"""

from __future__ import annotations

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


def optimizer(config):
  """AdamW after optional global-norm clipping, with learning_rate and weight_decay injected
  (optax.inject_hyperparams): the train step sets both from the replica's hparams."""
  def adamw(learning_rate, weight_decay):
    chain = [optax.clip_by_global_norm(config.grad_clip_norm)] if config.grad_clip_norm else []
    return optax.chain(*chain, optax.adamw(learning_rate, weight_decay=weight_decay))
  # Placeholders: train_step sets both from the replica's hparams before every update.
  return optax.inject_hyperparams(adamw)(learning_rate=0.0, weight_decay=0.0)
