"""ListOps (:ref:`Nangia & Bowman 2018 <ref-nangia2018>`), as in the Long Range Arena: evaluate
nested list operations.

  [MAX 2 9 [MIN 4 7 ] 0 ]  ->  9
Operators: [MAX, [MIN, [MED (median, rounded down), [SM (sum mod 10); operands are digits; the
label is the value, one of 10 classes. Trees are drawn as in the LRA generator: below max_depth a
node is an operator with probability 0.25, else a digit; expressions longer than max_length tokens
are redrawn.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
VOCAB = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + ("]",)
TOKEN_ID = {token: index for index, token in enumerate(VOCAB)}
OPERATOR_PROBABILITY = 0.25
EVALUATE = {
    "[MAX": max,
    "[MIN": min,
    "[MED": lambda args: int(np.floor(np.median(args))),
    "[SM": lambda args: sum(args) % 10,
}


@dataclasses.dataclass
class ListOpsConfig(synthetic.TaskConfig):
  max_depth: int = 6
  max_args: int = 5
  min_length: int = 8
  max_length: int = 128


class ListOps(synthetic.SyntheticTask):
  """ListOps: the value (0-9) of a nested MAX/MIN/MED/SM expression."""
  BUILDER_CONFIGS = [ListOpsConfig(name="default")]

  def vocab_size(self):
    return len(VOCAB)

  def token_names(self):
    return list(VOCAB)

  def num_classes(self):
    return 10

  def max_length(self):
    return self.options.max_length

  def _tree(self, rng, depth, operator_node=False):
    """Returns (tokens, value) of a random subtree."""
    if operator_node or (depth < self.options.max_depth and rng.random() < OPERATOR_PROBABILITY):
      operator = OPERATORS[rng.integers(len(OPERATORS))]
      children = [self._tree(rng, depth + 1)
                  for _ in range(rng.integers(2, self.options.max_args + 1))]
      tokens = [operator] + [t for child, _ in children for t in child] + ["]"]
      return tokens, EVALUATE[operator]([value for _, value in children])
    digit = int(rng.integers(10))
    return [str(digit)], digit

  def sample(self, rng):
    while True:  # the root is always an operator, as in LRA; redraw until the length fits
      tokens, value = self._tree(rng, 0, operator_node=True)
      if self.options.min_length <= len(tokens) <= self.options.max_length:
        return np.array([TOKEN_ID[t] for t in tokens], np.int32), value
