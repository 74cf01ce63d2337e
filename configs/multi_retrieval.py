"""Multi-retrieval (after Yu et al. 2025): D = 4 maxima max_s <w_i, x_s> over 16 vectors in
[0, 1]^8, read from the CLS token and trained on the mean squared error (evaluated as NMSE).

  python -m experiments.train --config=configs/multi_retrieval.py --workdir=workdir/multi_retrieval

A 2-layer encoder at d_model 32 (4 heads, no positional encoding: the targets do not depend on
the order of the vectors) with a linear embedding of the vectors (experiments/tasks/vectors.py).
Theory (Yu et al.) asks for h >= D heads, one softmax distribution per retrieved maximum;
configs/ablations/heads_binding.py sweeps the head count. NMSE 1 is predicting each target's mean.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task = "multi_retrieval"
  config.task_options = ml_collections.ConfigDict({
      "num_retrievals": 4, "length": 16, "features": 8, "num_train": 100000, "num_test": 2000})
  config.model.d_model = 32
  config.model.num_heads = 4
  config.model.mlp_dim = 64
  config.model.num_layers = 2
  config.model.positional_encoding = "none"
  config.model.pooling = "cls"
  config.batch_size = 64
  config.learning_rate = 1e-3
  config.warmup_steps = 100
  config.num_train_steps = 2000
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 1000
  config.attention_maps = 0
  return config
