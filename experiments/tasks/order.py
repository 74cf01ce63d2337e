"""Order: does marker A come before marker B? Only token order decides the label.

Each sequence holds A and B once, at random positions among random filler tokens; swapping A and B
flips the label and keeps the bag of tokens. A model without positional information sees the same
multiset for both labels, so it is exactly at chance (0.5); any positional encoding can solve it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

MARKER_A, MARKER_B, FIRST_FILLER = 1, 2, 3


@dataclasses.dataclass
class OrderConfig(synthetic.TaskConfig):
  max_length: int = 32      # sequences have lengths in [min_length, max_length]
  min_length: int = 0       # 0 = max_length // 2
  num_fillers: int = 16     # distinct filler tokens


class Order(synthetic.SyntheticTask):
  """Order: label 1 if marker A precedes marker B in the sequence, else 0."""
  BUILDER_CONFIGS = [OrderConfig(name="default")]

  def vocab_size(self):
    return FIRST_FILLER + self.options.num_fillers

  def token_names(self):
    return ["<pad>", "A", "B"] + [f"f{i}" for i in range(self.options.num_fillers)]

  def num_classes(self):
    return 2

  def max_length(self):
    return self.options.max_length

  def sample(self, rng):
    shortest = self.options.min_length or self.options.max_length // 2
    length = rng.integers(max(shortest, 2), self.options.max_length + 1)
    tokens = rng.integers(FIRST_FILLER, self.vocab_size(), size=length)
    first, second = np.sort(rng.choice(length, size=2, replace=False))
    label = int(rng.integers(2))
    tokens[first], tokens[second] = (MARKER_A, MARKER_B) if label else (MARKER_B, MARKER_A)
    return tokens, label
