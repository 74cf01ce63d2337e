"""Multi-query associative recall (:ref:`Arora et al. 2023 <ref-arora2023>`, "Zoology"), with a
target at every query.

A sequence lists ``num_pairs`` key-value pairs, then a query section in which ``num_queries``
distinct listed keys stand at random positions (the rest is padding):
  k_3 v_1 k_7 v_4 k_1 v_1 ... | _ k_7 _ _ k_1 _ k_3 ...   ->   targets at k_7: v_4, k_1: v_1, ...
Each query position must find its key among the pairs and report the value that follows it, so
every query carries its own loss (a one-label classifier of the same sequence would get one
lookup's worth of signal). The lookup needs attention to match a query against ``num_pairs``
keys out of ``num_keys``: capacity binds as pairs and keys grow and as d_k shrinks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks import synthetic

FIRST_KEY = 1


@dataclasses.dataclass
class MQARConfig(synthetic.TaskConfig):
  num_pairs: int = 8        # key-value pairs listed
  num_queries: int = 8      # keys queried (distinct, each listed)
  num_keys: int = 32        # distinct key tokens
  num_values: int = 32      # distinct value tokens = classes
  length: int = 32          # 2 * num_pairs + the query section


class MQAR(synthetic.SyntheticTask):
  """MQAR: at every query position, the value listed after the queried key."""
  BUILDER_CONFIGS = [MQARConfig(name="default")]
  TOKEN_LEVEL = True

  def first_value(self):
    return FIRST_KEY + self.options.num_keys

  def vocab_size(self):
    return self.first_value() + self.options.num_values

  def token_names(self):
    return (["<pad>"] + [f"k{i}" for i in range(self.options.num_keys)] +
            [f"v{i}" for i in range(self.options.num_values)])

  def num_classes(self):
    return self.options.num_values

  def max_length(self):
    return self.options.length

  def check_options(self):
    opts = self.options
    if not 1 <= opts.num_queries <= opts.num_pairs <= opts.num_keys:
      raise ValueError("mqar needs 1 <= num_queries <= num_pairs <= num_keys, got "
                       f"{opts.num_queries}, {opts.num_pairs}, {opts.num_keys}.")
    if opts.length < 2 * opts.num_pairs + opts.num_queries:
      raise ValueError(f"mqar needs length >= 2 * num_pairs + num_queries = "
                       f"{2 * opts.num_pairs + opts.num_queries}, got {opts.length}.")

  def sample(self, rng):
    opts = self.options
    keys = rng.choice(opts.num_keys, size=opts.num_pairs, replace=False) + FIRST_KEY
    values = rng.integers(opts.num_values, size=opts.num_pairs)
    tokens = np.full(opts.length, synthetic.PAD_ID, np.int32)
    targets = np.full(opts.length, synthetic.IGNORE, np.int32)
    tokens[0:2 * opts.num_pairs:2] = keys
    tokens[1:2 * opts.num_pairs:2] = values + self.first_value()
    queried = rng.choice(opts.num_pairs, size=opts.num_queries, replace=False)
    section = opts.length - 2 * opts.num_pairs
    where = 2 * opts.num_pairs + np.sort(rng.choice(section, size=opts.num_queries,
                                                    replace=False))
    tokens[where], targets[where] = keys[queried], values[queried]
    return tokens, targets
