"""q-sparse averaging (Sanford, Hsu & Telgarsky 2023, "Representational strengths and limitations
of transformers"): every token outputs the average of the vectors at q positions it names.

Token s carries [z_s, 1_{S_s}, e_s]: a vector z_s ~ N(0, I_d'), the indicator [T] of a set S_s of
q distinct positions (drawn uniformly), and its own position as a one-hot [T] (so positions can
be matched without a positional encoding). The target of token s is (1/q) sum_{t in S_s} z_t. One
head solves it when its d_k covers the T positions and the d' values (query 1_{S_s}, key e_t,
value z_t), so it needs total width rather than many heads: a control for the head count.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import vectors


@dataclasses.dataclass
class SparseAverageConfig(vectors.VectorConfig):
  length: int = 16        # T tokens
  num_selected: int = 2   # q, the size of each token's set
  value_dim: int = 8      # d', the averaged vectors' dimension


def sparse_averages(z, selected) -> np.ndarray:
  """(1/q) sum_{t in S_s} z_t: z [..., T, d'], selected [..., T, T] (row s: 1_{S_s}) -> [..., T, d']."""
  return selected @ z / np.sum(selected, axis=-1, keepdims=True)


class SparseAverage(vectors.VectorTask):
  """q-sparse averaging: at every token, the mean of the vectors at the q positions it names."""
  BUILDER_CONFIGS = [SparseAverageConfig(name="default")]
  TOKEN_LEVEL = True

  def input_features(self):
    return self.options.value_dim + 2 * self.options.length

  def num_outputs(self):
    return self.options.value_dim

  def max_length(self):
    return self.options.length

  def check_options(self):
    if not 1 <= self.options.num_selected <= self.options.length:
      raise ValueError(f"sparse_average needs 1 <= num_selected <= length, got "
                       f"{self.options.num_selected} and {self.options.length}.")

  def sample(self, rng):
    length, q = self.options.length, self.options.num_selected
    z = rng.standard_normal((length, self.options.value_dim))  # [T, d']
    selected = np.zeros((length, length))  # [T, T], row s: the indicator of S_s
    for row in selected:
      row[rng.choice(length, size=q, replace=False)] = 1.0
    tokens = np.concatenate([z, selected, np.eye(length)], axis=-1)  # [T, d' + 2T]
    return tokens, sparse_averages(z, selected)
