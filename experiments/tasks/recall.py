"""Multi-query associative recall: look up several keys at once and combine their values.

A sequence lists key-value pairs, a separator, then ``num_queries`` of the keys:
  k_1 v_1 k_2 v_2 ... k_P v_P SEP q_1 ... q_Q   ->   label = (sum of the values of q_1..q_Q) mod 10
Every query needs its own lookup, so one attention head cannot do it all; difficulty rises with
``num_pairs`` (more distractors) and ``num_queries`` (more lookups combined).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

SEPARATOR, FIRST_KEY, NUM_VALUES = 1, 2, 10


@dataclasses.dataclass
class RecallConfig(synthetic.TaskConfig):
  num_pairs: int = 8        # key-value pairs listed
  num_queries: int = 2      # keys queried and summed
  num_keys: int = 16        # distinct key tokens


class Recall(synthetic.SyntheticTask):
  """Recall: (sum of the values of the queried keys) mod 10."""
  BUILDER_CONFIGS = [RecallConfig(name="default")]

  def vocab_size(self):
    return FIRST_KEY + self.options.num_keys + NUM_VALUES

  def num_classes(self):
    return NUM_VALUES

  def max_length(self):
    return 2 * self.options.num_pairs + 1 + self.options.num_queries

  def sample(self, rng):
    opts = self.options
    if not opts.num_queries <= opts.num_pairs <= opts.num_keys:
      raise ValueError("recall needs num_queries <= num_pairs <= num_keys, got "
                       f"{opts.num_queries}, {opts.num_pairs}, {opts.num_keys}.")
    keys = rng.choice(opts.num_keys, size=opts.num_pairs, replace=False) + FIRST_KEY
    values = rng.integers(NUM_VALUES, size=opts.num_pairs)
    queried = rng.choice(opts.num_pairs, size=opts.num_queries, replace=False)
    pairs = np.stack([keys, values + FIRST_KEY + opts.num_keys], axis=1).reshape(-1)
    tokens = np.concatenate([pairs, [SEPARATOR], keys[queried]])
    return tokens, int(values[queried].sum() % NUM_VALUES)
