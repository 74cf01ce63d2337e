"""Farthest point (after Amsel, Yehudai & Bruna 2024, "On the benefits of rank in attention
layers", arXiv 2407.16153): every point outputs the point farthest from it.

N points x_s drawn uniformly on the unit sphere in d dimensions; the target of token s is
x_t for t = argmax_{t != s} ||x_s - x_t|| = argmin_{t != s} <x_s, x_t>. One head of full rank
solves it (W_Q = beta I, W_K = -I, W_V W_O = I, beta large: softmax(-beta <x_s, x_t>) picks the
farthest point), while heads of rank r < d need a number of heads exponential in d. The targets
are permutation-equivariant, so the task is meant to run without a positional encoding.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import vectors


@dataclasses.dataclass
class FarthestPointConfig(vectors.VectorConfig):
  length: int = 16      # N points
  dimension: int = 16   # d, the sphere's ambient dimension


def farthest(x) -> np.ndarray:
  """The index of each point's farthest other point: x [..., N, d] -> [..., N] int."""
  distance = np.sum((x[..., :, None, :] - x[..., None, :, :]) ** 2, axis=-1)  # [..., N, N]
  diagonal = np.eye(x.shape[-2], dtype=bool)
  return np.argmax(np.where(diagonal, -np.inf, distance), axis=-1)


class FarthestPoint(vectors.VectorTask):
  """Farthest point: at every token, the point farthest from it (a vector of d values)."""
  BUILDER_CONFIGS = [FarthestPointConfig(name="default")]
  TOKEN_LEVEL = True

  def input_features(self):
    return self.options.dimension

  def num_outputs(self):
    return self.options.dimension

  def max_length(self):
    return self.options.length

  def check_options(self):
    if self.options.length < 2:
      raise ValueError(f"farthest_point needs length >= 2 points, got {self.options.length}.")

  def sample(self, rng):
    x = rng.standard_normal((self.options.length, self.options.dimension))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)  # [N, d] on the unit sphere
    return x, x[farthest(x)]  # [N, d], [N, d]
