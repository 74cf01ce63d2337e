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

from configs.ablations import sweep_config


def get_config(mode=None):
  sweep = sweep_config(
      mode, steps=600, eval_every=100, warmup=100,
      variants=((name, {"model": {"positional_encoding": name}})
                for name in ("none", "sinusoidal", "learned", "rope", "alibi")),
      extra_evals={"long": {"max_length": 64}})
  sweep.train.model.d_model = 64
  sweep.train.model.mlp_dim = 128
  sweep.train.model.max_length = 64
  return sweep
