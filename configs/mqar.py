"""Multi-query associative recall (Zoology, Arora et al. 2023): a target at every query position.

  python -m experiments.train --config=configs/mqar.py --workdir=workdir/mqar

2 key-value pairs out of 8 keys and 8 values, both keys queried (in random order) in an
8-token sequence; a 2-layer encoder at d_model 64 (4 heads, RoPE) with a token-level head. The
lookup is an induction circuit (a key's position must learn the value after it, a query must
find its key), and it appears suddenly: the loss sits at ln(P), the model knowing the listed
values but not which goes with which key, then drops. How long it sits there grows fast with P,
so this config is small enough for a 2-core CPU (how long, at P = 2, 3 and 4:
docs/guides/training.md, "Tasks"). The heads and scaling ablations run on this config; raise
num_pairs (and num_train_steps) where compute allows.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task = "mqar"
  config.task_options = ml_collections.ConfigDict({
      "num_pairs": 2, "num_queries": 2, "num_keys": 8, "num_values": 8, "length": 8,
      "num_train": 20000, "num_test": 1000})
  config.model.d_model = 64
  config.model.num_heads = 4
  config.model.mlp_dim = 128
  config.model.num_layers = 2
  config.model.positional_encoding = "rope"
  config.batch_size = 32
  config.learning_rate = 1e-3
  config.warmup_steps = 100
  config.num_train_steps = 1500
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 500
  return config
