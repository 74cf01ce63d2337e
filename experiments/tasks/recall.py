"""Multi-query associative recall: look up several keys at once and report all their values.

A sequence lists key-value pairs, a separator, then ``num_queries`` distinct listed keys:
  k_1 v_1 k_2 v_2 ... k_P v_P SEP q_1 ... q_Q   ->   label = (value(q_1), ..., value(q_Q))
with the tuple of values read as one number in base ``num_values`` (num_values^Q classes). Each
query needs its own lookup, so a model must attend to several places at once; difficulty rises
with ``num_pairs`` (distractors), ``num_queries`` (simultaneous lookups) and ``num_values``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

SEPARATOR, FIRST_KEY = 1, 2


@dataclasses.dataclass
class RecallConfig(synthetic.TaskConfig):
  num_pairs: int = 8        # key-value pairs listed
  num_queries: int = 2      # keys queried at once
  num_keys: int = 16        # distinct key tokens
  num_values: int = 4       # distinct value tokens


class Recall(synthetic.SyntheticTask):
  """Recall: the values of the queried keys, as one class in base num_values."""
  BUILDER_CONFIGS = [RecallConfig(name="default")]

  def first_value(self):
    return FIRST_KEY + self.options.num_keys

  def vocab_size(self):
    return self.first_value() + self.options.num_values

  def token_names(self):
    return (["<pad>", "SEP"] + [f"k{i}" for i in range(self.options.num_keys)] +
            [f"v{i}" for i in range(self.options.num_values)])

  def num_classes(self):
    return self.options.num_values ** self.options.num_queries

  def max_length(self):
    return 2 * self.options.num_pairs + 1 + self.options.num_queries

  def check_options(self):
    opts = self.options
    if not opts.num_queries <= opts.num_pairs <= opts.num_keys:
      raise ValueError("recall needs num_queries <= num_pairs <= num_keys, got "
                       f"{opts.num_queries}, {opts.num_pairs}, {opts.num_keys}.")

  def sample(self, rng):
    opts = self.options
    keys = rng.choice(opts.num_keys, size=opts.num_pairs, replace=False) + FIRST_KEY
    values = rng.integers(opts.num_values, size=opts.num_pairs)
    queried = rng.choice(opts.num_pairs, size=opts.num_queries, replace=False)
    pairs = np.stack([keys, values + self.first_value()], axis=1).reshape(-1)  # k v k v ...
    tokens = np.concatenate([pairs, [SEPARATOR], keys[queried]])
    label = sum(int(v) * opts.num_values ** i for i, v in enumerate(values[queried][::-1]))
    return tokens, label
