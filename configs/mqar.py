"""Multi-query associative recall (Zoology, Arora et al. 2023): a target at every query position.

  python -m experiments.train --config=configs/mqar.py --workdir=workdir/mqar

8 key-value pairs out of 32 keys and 32 values, 8 queries in a 32-token sequence; a 2-layer encoder
at d_model 64 with a token-level head. Zoology finds two attention layers at d_model 64 solve MQAR
when the learning rate is right; the heads and scaling ablations run on this config.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task = "mqar"
  config.task_options = ml_collections.ConfigDict({
      "num_pairs": 8, "num_queries": 8, "num_keys": 32, "num_values": 32, "length": 32,
      "num_train": 20000, "num_test": 1000})
  config.model.d_model = 64
  config.model.num_heads = 4
  config.model.mlp_dim = 128
  config.model.num_layers = 2
  config.learning_rate = 3e-3
  config.num_train_steps = 1500
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 500
  return config
