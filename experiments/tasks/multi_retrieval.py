"""Multi-retrieval (after Yu et al. 2025, "The effect of attention head count on transformer
approximation", arXiv 2510.06662): D maxima of projections, read from one CLS token.

T vectors x_s ~ U[0, 1]^F and D fixed unit directions w_i (drawn once from ``directions_seed``,
the same for every split and data seed); the target is, for each i,
  y_i = (max_s <w_i, x_s> - mu_i) / sigma_i,
with mu_i and sigma_i the mean and standard deviation of that maximum over a reference draw (so
each y_i has mean 0 and variance 1). Each y_i needs its own softmax distribution (a head that
puts its weight on the token maximising <w_i, x_s>), so theory asks for h >= D heads.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from experiments.tasks import vectors

REFERENCE_SIZE = 20000  # sequences drawn to estimate mu_i and sigma_i


@dataclasses.dataclass
class MultiRetrievalConfig(vectors.VectorConfig):
  num_retrievals: int = 4   # D directions, D targets
  length: int = 16          # T vectors per sequence
  features: int = 8         # F, their dimension
  directions_seed: int = 0  # seed of the directions w_i (the function, apart from the data)


def directions(seed: int, num_retrievals: int, features: int) -> np.ndarray:
  """D fixed random unit vectors w_i: [D, F]."""
  w = np.random.default_rng([seed, 2]).standard_normal((num_retrievals, features))
  return w / np.linalg.norm(w, axis=-1, keepdims=True)


def maxima(x, w) -> np.ndarray:
  """max_s <w_i, x_s>: x [..., T, F], w [D, F] -> [..., D]."""
  return np.max(np.einsum("...sf,df->...sd", x, w), axis=-2)


@functools.lru_cache(maxsize=8)
def function(directions_seed: int, num_retrievals: int, length: int, features: int):
  """The task's fixed function of the inputs: (w [D, F], mu [D], sigma [D])."""
  w = directions(directions_seed, num_retrievals, features)
  reference = np.random.default_rng([directions_seed, 3]).random(
      (REFERENCE_SIZE, length, features))  # [R, T, F]
  y = maxima(reference, w)  # [R, D]
  return w, y.mean(axis=0), y.std(axis=0)


class MultiRetrieval(vectors.VectorTask):
  """Multi-retrieval: the D standardised maxima max_s <w_i, x_s>, one vector per sequence."""
  BUILDER_CONFIGS = [MultiRetrievalConfig(name="default")]

  def input_features(self):
    return self.options.features

  def num_outputs(self):
    return self.options.num_retrievals

  def max_length(self):
    return self.options.length

  def sample(self, rng):
    opts = self.options
    x = rng.random((opts.length, opts.features))  # [T, F]
    w, mu, sigma = function(opts.directions_seed, opts.num_retrievals, opts.length, opts.features)
    return x, (maxima(x, w) - mu) / sigma  # [T, F], [D]
