"""Length-generalisation tasks from the Chomsky-hierarchy benchmark (Delétang et al. 2023), used by
:ref:`Ruoss et al. (2023) <ref-ruoss2023>` to compare positional encodings: trained on short
strings, tested on longer.

  even_pairs        a b b a a -> 1   is the number of "ab" and "ba" substrings even? It is exactly
                                     when the first and the last symbol are equal, so the model
                                     must find both ends of the string: what an encoding says about
                                     position decides whether that survives unseen lengths.
  cycle_navigation  + 0 - + +  -> 2  the position on a cycle of 5 after the moves (+1, stay, -1)
                                     from 0, i.e. (#plus - #minus) mod 5. The answer ignores order:
                                     a model without positions loses nothing, and an encoding can
                                     only add positions it has never seen.

String lengths are uniform in [min_length, max_length]; train on one range and evaluate on
longer ones by overriding the two options (the sweep's extra_evals).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

CYCLE = 5


@dataclasses.dataclass
class LengthConfig(synthetic.TaskConfig):
  min_length: int = 1
  max_length: int = 20


class _LengthTask(synthetic.SyntheticTask):
  SYMBOLS: tuple[str, ...] = ()

  def vocab_size(self):
    return 1 + len(self.SYMBOLS)

  def token_names(self):
    return ["<pad>", *self.SYMBOLS]

  def max_length(self):
    return self.options.max_length

  def check_options(self):
    if not 1 <= self.options.min_length <= self.options.max_length:
      raise ValueError(f"{self.name} needs 1 <= min_length <= max_length, got "
                       f"{self.options.min_length}, {self.options.max_length}.")

  def sample(self, rng):
    length = rng.integers(self.options.min_length, self.options.max_length + 1)
    symbols = rng.integers(len(self.SYMBOLS), size=length)
    return symbols + 1, self.label(symbols)


class EvenPairs(_LengthTask):
  """Even pairs: 1 if the string over {a, b} has an even number of "ab" and "ba", else 0."""
  BUILDER_CONFIGS = [LengthConfig(name="default")]
  SYMBOLS = ("a", "b")

  def num_classes(self):
    return 2

  @staticmethod
  def label(symbols):
    return int(symbols[0] == symbols[-1])


class CycleNavigation(_LengthTask):
  """Cycle navigation: the final position on a cycle of 5 after moves +1, 0, -1 from 0."""
  BUILDER_CONFIGS = [LengthConfig(name="default")]
  SYMBOLS = ("+", "0", "-")

  def num_classes(self):
    return CYCLE

  @staticmethod
  def label(symbols):
    return int(np.sum(np.array([1, 0, -1])[symbols]) % CYCLE)
