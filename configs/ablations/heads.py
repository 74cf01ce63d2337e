"""Heads ablation: num_heads in {1, 2, 4, 8, 16, 32} at d_model = 64 (d_k = 64 .. 2).

  python -m experiments.sweep --config=configs/ablations/heads.py --workdir=workdir/ablations/heads
  python -m experiments.sweep --config=configs/ablations/heads.py:quick --workdir=/tmp/heads

Task: `order` (is marker A before marker B?) with a one-layer encoder that reads out through its
CLS token, which has to find both markers in its single attention layer. One head returns one
weighted average of the vectors it attends to; with equal weight on A and B that average is the
same whichever marker comes first, so a single head must learn an unequal weighting to tell the
order, while two heads can each fetch one marker. The question is row (A) of Vaswani et al.
(2017) Table 3: are several heads better than one at the same width, and do too many (d_k = 2)
hurt?

Runtime of the full sweep (6 variants x 3 seeds): 6.5 minutes on the 2-core CPU (2026-11-22).
Result (test accuracy, mean +- std over 3 seeds): 1 head 0.914 +- 0.148 (one seed of three stuck
at 0.744), 2 heads 0.998, 4 to 32 heads 0.999-1.000; with 4 or more heads every seed passes 0.99
by step 200, with 2 heads by step 500. Details and plots: README, Results.
"""

from configs.ablations import sweep_config


def get_config(mode=None):
  sweep = sweep_config(mode, steps=600, eval_every=100, warmup=100, variants=(
      (f"heads_{n}", {"model": {"num_heads": n}}) for n in (1, 2, 4, 8, 16, 32)))
  sweep.train.model.d_model = 64
  sweep.train.model.mlp_dim = 128
  sweep.train.model.num_layers = 1
  return sweep
