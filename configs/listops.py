"""ListOps (Nangia & Bowman 2018; Long Range Arena): evaluate nested MAX/MIN/MED/SM expressions.

  python -m experiments.train --config=configs/listops.py --workdir=workdir/listops

Sequences up to 128 tokens and depth 6 (LRA uses 2000 tokens and depth 10; raise
--config.task_options.max_length for that). Not yet run to completion on the 2-core CPU; the
Long Range Arena reports about 0.36-0.38 test accuracy for vanilla Transformers at length 2000.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task = "listops"
  config.task_options = ml_collections.ConfigDict({
      "max_depth": 6, "max_args": 5, "min_length": 8, "max_length": 128,
      "num_train": 20000, "num_test": 2000})
  config.model.num_layers = 4
  config.model.pooling = "mean"
  config.num_train_steps = 3000
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
