"""Positional-encoding ablation: none, sinusoidal, learned, rope, alibi; evaluated on the training
lengths and on sequences up to twice as long.

  python -m experiments.sweep --config=configs/ablations/positional.py \
      --workdir=workdir/ablations/positional

Task: `order` (is marker A before marker B?), trained on lengths 16..32. Swapping A and B keeps
the bag of tokens, so without a positional encoding the model is at chance (0.5) by
construction, and any encoding can solve the task. The "long" test set has lengths 32..64, so it
checks the claim that sinusoids let a model extrapolate to sequences longer than any it trained
on. The model supports 64 positions (model.max_length); a learned table's rows past 32 are never
trained.

Runtime of the full sweep (5 variants x 3 seeds): 7.7 minutes on the 2-core CPU (2026-11-22).
Result (test accuracy on training lengths / on lengths 32..64, mean over 3 seeds): none
0.492 / 0.497 (chance), sinusoidal 0.999 / 0.759, learned 0.999 / 0.733, rope 1.000 / 0.868,
alibi 1.000 / 0.978. Details and plots: README, Results.
"""

import ml_collections

from configs import default


def get_config(mode=None):
  quick = mode == "quick"
  train = default.get_config()
  train.model.d_model = 64
  train.model.mlp_dim = 128
  train.model.max_length = 64
  train.num_train_steps = 60 if quick else 600
  train.eval_every_steps = 30 if quick else 100
  train.checkpoint_every_steps = train.eval_every_steps
  train.warmup_steps = 10 if quick else 100
  train.attention_maps = 0
  if quick:
    train.task_options.num_train = 2000
    train.task_options.num_test = 256

  sweep = ml_collections.ConfigDict()
  sweep.train = train
  sweep.num_seeds = 2 if quick else 3
  sweep.vmap_seeds = True
  sweep.extra_evals = ml_collections.ConfigDict({"long": {"max_length": 64}})
  sweep.variants = tuple((name, {"model": {"positional_encoding": name}})
                         for name in ("none", "sinusoidal", "learned", "rope", "alibi"))
  return sweep
