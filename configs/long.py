"""Long sequences: the `order` task at lengths 1024-2048, a 4-layer encoder, for GPUs and TPUs.

  python -m experiments.train --config=configs/long.py --workdir=workdir/long \
      --config.compute_dtype=bfloat16

The two markers can sit up to 2047 tokens apart, so attention has to span the whole sequence; the
attention products are 57% of the model FLOPs here (4 T d of 8 d^2 + 4 d mlp + 4 T d per token
and layer at T = 2048). On a GPU in bfloat16 the automatic choice is cuDNN's flash kernel. Meant
for an accelerator; docs/performance.md ("On an NVIDIA H100") gives its measured throughput.
"""

import ml_collections

from configs import default


def get_config():
  config = default.get_config()
  config.task_options = ml_collections.ConfigDict({
      "max_length": 2048, "num_fillers": 16, "num_train": 8192, "num_test": 512})
  config.model.d_model = 256
  config.model.num_heads = 8
  config.model.num_layers = 4
  config.model.mlp_dim = 1024
  config.batch_size = 32
  config.num_train_steps = 1000
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 500
  config.attention_maps = 0
  return config
