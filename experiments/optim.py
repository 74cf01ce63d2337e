"""Learning-rate schedules and the AdamW optimizer, from optax."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def noam_schedule(peak_value: float, warmup_steps: int):
  """Vaswani et al. (2017), eq. 3, normalised to peak at ``peak_value`` after warmup:
  lr(step) = peak * min(step / warmup, sqrt(warmup / step))."""
  warmup = max(warmup_steps, 1)

  def schedule(step):
    step = jnp.maximum(step, 1).astype(jnp.float32)
    return peak_value * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
  return schedule


def learning_rate_schedule(config):
  if config.schedule == "constant":
    return optax.constant_schedule(config.learning_rate)
  if config.schedule == "noam":
    return noam_schedule(config.learning_rate, config.warmup_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.learning_rate, warmup_steps=config.warmup_steps,
      decay_steps=max(config.num_train_steps, config.warmup_steps + 1))


def optimizer(config):
  """AdamW with optional global-norm clipping; the schedule is returned for logging."""
  schedule = learning_rate_schedule(config)
  chain = [optax.clip_by_global_norm(config.grad_clip_norm)] if config.grad_clip_norm else []
  chain.append(optax.adamw(schedule, weight_decay=config.weight_decay))
  return optax.chain(*chain), schedule
