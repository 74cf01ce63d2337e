"""Default: a 2-layer encoder learns the `order` task (is marker A before marker B?).

  python -m experiments.train --config=configs/default.py --workdir=/tmp/default

The label depends only on token order, so the positional encoding is what makes it learnable.
Every other config derives from this one and changes a few fields.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.task = "order"                    # a name in experiments.tasks.TASKS
  config.task_options = ml_collections.ConfigDict({  # the task's own options (see task_options)
      "max_length": 32, "num_fillers": 16, "num_train": 20000, "num_test": 2000})
  config.data_dir = "~/tensorflow_datasets"  # where TFDS caches generated or downloaded data

  config.model = ml_collections.ConfigDict()
  config.model.d_model = 128               # width of the residual stream
  config.model.num_heads = 4               # must divide d_model; head_dim = d_model / num_heads
  config.model.num_layers = 2              # encoder blocks
  config.model.mlp_dim = 256               # hidden width of the position-wise feed-forward
  config.model.max_length = 0             # positions the model supports; 0 = the task's length
  config.model.positional_encoding = "sinusoidal"  # none|sinusoidal|learned|randomized|rope|alibi
  config.model.attention_scale = "inv_sqrt"  # inv_sqrt | none | inv | learned, or a number
  config.model.head_dim = 0                # d_k; 0 = d_model / num_heads (the paper)
  config.model.normalize_qk = False        # LayerNorm on each head's queries and keys (QK-norm)
  config.model.query_init_scale = 1.0      # W_Q's initial values x this (1: lecun normal)
  # "" = automatic (attention_jax.select_implementation); or a name in
  # attention_jax.attention.IMPLEMENTATIONS (its KERNELS say what each serves and on which backend)
  config.model.attention_impl = ""
  config.model.dropout_rate = 0.0          # residual and feed-forward dropout
  config.model.attention_dropout_rate = 0.0  # dropout on attention weights
  config.model.pre_layer_norm = False      # False = post-LN as in the paper
  config.model.causal = False              # True: position t attends to positions <= t only
  config.model.pooling = "cls"             # cls | mean | last (sequence-level tasks; causal: last)
  # mha (plain), a name in attention_jax.variants.REGISTRY (talking_heads, dcmha, moh, overlap,
  # gated, differential, sinks, sigmoid, ...: attention_jax/variants/, one file per variant), or
  # a Variant subclass of your own as "package.module:Class"
  config.model.head_variant = "mha"
  # its options, one mapping of the variant class's fields, e.g. {"shared_heads": 2,
  # "routed_heads": 1} for moh, {"schedule": "half_index"} for overlap; a key set here in a
  # config file can then be overridden: --config.model.head_variant_options.shared_heads=4
  config.model.head_variant_options = ml_collections.ConfigDict()
  # deprecated, read for one release: use head_variant_options
  config.model.moh_shared_heads = -1
  config.model.moh_routed_heads = -1
  config.model.overlap_schedule = "index"

  # The device mesh ("replica", "data", "sequence"). sequence > 1 runs attention context-parallel
  # over that axis (strategy "ring", or "all_gather", which ALiBi's bias needs; the other layers
  # are sharded as XLA propagates it); data = 0 gives the batch the devices that replicas and
  # sequence leave.
  config.mesh = ml_collections.ConfigDict({"data": 0, "sequence": 1, "strategy": "ring"})
  config.batch_size = 64                   # global batch, split over all devices
  config.learning_rate = 1e-3              # peak learning rate
  config.schedule = "warmup_cosine"        # constant | warmup_cosine | noam (inverse sqrt)
  config.warmup_steps = 100                # linear warmup steps
  config.weight_decay = 0.01               # AdamW: decoupled; SGD: coupled (in the gradient)
  config.grad_clip_norm = 1.0              # global-norm clipping; 0 disables
  config.optimizer = "adamw"               # adamw | sgd (with momentum; experiments/optim.py)
  config.momentum = 0.9                    # sgd's momentum; 0 disables
  config.query_lr_scale = 1.0              # W_Q's learning rate x this (its updates scaled)
  config.label_smoothing = 0.0             # 0 disables
  config.num_train_steps = 600             # optimizer steps
  config.eval_every_steps = 200            # evaluate on the test split this often
  config.log_every_steps = 50              # write training metrics this often
  config.checkpoint_every_steps = 200      # save a checkpoint this often (and at the end)
  config.keep_checkpoints = 3              # how many recent checkpoints to keep
  config.seed = 0                          # one seed for init, dropout and data order
  # random | oracle: start from the task's hand-set solution (experiments/oracles.py) plus
  # init_noise x the random initialisation; init_beta sets the oracle's logit sharpness (0: its own)
  config.init = "random"
  config.init_noise = 0.0
  config.init_beta = 0.0
  config.compute_dtype = "float32"         # float32 | bfloat16 (parameters stay float32)
  config.attention_maps = 4                # test examples to draw attention maps for; 0 = none
  return config
