"""Farthest point (after Amsel, Yehudai & Bruna 2024): each of 16 points on the unit sphere in 16
dimensions outputs the point farthest from it, trained on the mean squared error (evaluated as
NMSE).

  python -m experiments.train --config=configs/farthest_point.py --workdir=workdir/farthest_point

The training of configs/multi_retrieval.py (2 layers, no positional encoding: the task is
permutation-equivariant) at d_model 16 with 1 head of d_k 16, a linear embedding of the points
and a read-out at every token. One full-rank head solves it (W_Q = beta I, W_K = -I,
W_V W_O = I); heads of rank d_k < 16 need exponentially many heads
(experiments/tasks/farthest_point.py). configs/ablations/heads_binding.py sweeps the head count.
NMSE 1 is predicting each coordinate's mean.
"""

import ml_collections

from configs import multi_retrieval


def get_config():
  config = multi_retrieval.get_config()
  config.task = "farthest_point"
  config.task_options = ml_collections.ConfigDict({
      "length": 16, "dimension": 16, "num_train": 100000, "num_test": 2000})
  config.model.d_model = 16
  config.model.num_heads = 1
  return config
