"""Multi-query associative recall: 8 key-value pairs, 2 keys queried at once, 4^2 = 16 classes.

  python -m experiments.train --config=configs/recall.py --workdir=workdir/recall

Each query needs its own lookup, so several heads must work at once; turn the difficulty up with
--config.task_options.num_pairs / num_queries / num_values.

Measured on the 2-core CPU (2026-11-22, about 3.5 minutes): test accuracy 0.1975 after 3000 steps,
chance 0.0625 -- this 2-layer model has not learned the lookup in that budget (its CLS token
attends to the first value). With --config.task_options.num_queries=1 and 1500 steps: 0.4555,
chance 0.25. A configuration that solves the task is still to be found.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task = "recall"
  config.task_options = ml_collections.ConfigDict({
      "num_pairs": 8, "num_queries": 2, "num_keys": 16, "num_values": 4, "num_train": 20000,
      "num_test": 2000})
  config.model.num_layers = 2
  config.num_train_steps = 3000
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
