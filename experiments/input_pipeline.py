"""Batches from a task's splits, determined by the step alone (so a resumed run sees the same data).

The global batch at step s is a slice of a per-epoch permutation drawn from (seed, epoch). Every
process computes it and places the pieces its own devices hold, as the sharding's index map says
(any mesh: replica, data or sequence axes may span processes).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from experiments import config_check


class TrainBatches:
  """batch(step) -> {"tokens": [B, L] int32, "labels": [B] or [B, L] int32}, B the global batch
  size."""

  def __init__(self, split, batch_size: int, seed: int):
    if len(split.labels) < batch_size:
      raise config_check.ConfigError(
          f"batch_size={batch_size} exceeds the {len(split.labels)} training examples; lower "
          "batch_size or raise task_options.num_train.")
    self.split, self.batch_size, self.seed = split, batch_size, seed
    self.steps_per_epoch = len(split.labels) // batch_size

  @functools.lru_cache(maxsize=2)
  def _permutation(self, epoch: int):
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.split.labels))

  def batch(self, step: int) -> dict:
    epoch, index = divmod(step, self.steps_per_epoch)
    rows = self._permutation(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
    return {"tokens": self.split.tokens[rows], "labels": self.split.labels[rows]}


def eval_batches(split, batch_size: int):
  """The whole split in batches of ``batch_size``; the last is padded and carries weight 0."""
  for start in range(0, len(split.labels), batch_size):
    tokens, labels = split.tokens[start:start + batch_size], split.labels[start:start + batch_size]
    weight = np.ones(len(labels), np.float32)
    missing = batch_size - len(labels)
    if missing:
      rows = lambda x: np.pad(x, ((0, missing),) + ((0, 0),) * (x.ndim - 1))
      tokens, labels, weight = rows(tokens), rows(labels), rows(weight)
    yield {"tokens": tokens, "labels": labels, "weight": weight}


def shard(batch: dict, sharding) -> dict:
  """Global NumPy batch -> global jax.Arrays laid out by ``sharding``: each process places the
  slices its devices own (``jax.make_array_from_callback`` asks for them by index)."""
  return {name: jax.make_array_from_callback(x.shape, sharding, lambda index, x=x: x[index])
          for name, x in batch.items()}
