"""Scaling ablation: how the attention logits are scaled -- 1/sqrt(d_k) (the paper), none, 1/d_k,
a learned per-head temperature, and QK-norm (LayerNorm on each head's queries and keys, with the
paper's 1/sqrt(d_k)) -- at d_k = 16, 64 and 256, each across a learning-rate grid.

  python -m experiments.sweep --config=configs/ablations/scaling.py \
      --workdir=workdir/ablations/scaling
  python -m experiments.sweep --config=configs/ablations/scaling.py:accelerator \
      --workdir=workdir/ablations/scaling_accelerator
  python -m experiments.sweep --config=configs/ablations/scaling.py:quick --workdir=/tmp/scaling

Question: does the scale matter once the learning rate is tuned, and does it change how
sensitive training is to the learning rate? Task: `mqar`, where attention has to be sharp (each
query must pick one key out of the listed ones). One head per layer at d_model 64; d_k is set
by model.head_dim, so the residual stream stays the same while d_k grows. Expected from the
literature: without scaling, Var(q . k) grows with d_k, the softmax saturates and learning slows
(Vaswani et al. 2017, footnote 4); Wortsman et al. (2023) find that attention logits growing
without bound make large learning rates diverge (runs whose maximum logit passed about 1e4) and
that QK-layernorm removes that, flattening the loss-against-learning-rate curve (their LR
sensitivity). The report logs the largest attention logit at every log step, counts the
diverged runs and gives each variant's LR sensitivity.

`:accelerator` is the study sized for one GPU or TPU: d_k 64, 256 and 1024, the paper's scale
against none and QK-norm, 1000 steps, 6 seeds x 5 learning rates, the learning rate chosen on a
validation stream; its predictions, fixed before it ran, are ``predictions`` below (python -m
experiments.findings). `:quick` is a smoke test of the pipeline. The results, with their
runtime and provenance: docs/results/scaling.md.
"""

from configs import mqar
from configs.ablations import check_mode, sweep_config

HEAD_DIMS = (16, 64, 256)
SCALES = {"inv_sqrt": {}, "none": {"attention_scale": "none"}, "inv": {"attention_scale": "inv"},
          "learned": {"attention_scale": "learned"}, "qk_norm": {"normalize_qk": True}}
LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 1e-1)
# The accelerator preset: d_k up to 1024, the paper's scale against none and QK-norm, more
# steps and seeds, the learning rate chosen on a validation stream.
ACCELERATOR_HEAD_DIMS = (64, 256, 1024)
ACCELERATOR_SCALES = ("inv_sqrt", "none", "qk_norm")
ACCELERATOR_STEPS, ACCELERATOR_SEEDS = 1000, 6
# Seeds per arm on the CPU: enough for the exact tests of the report to reach p < 0.05 after Holm
# over the study's 12 comparisons (experiments/statistics.py, smallest_p).
NUM_SEEDS = 10


def get_config(mode=None):
  check_mode(mode)
  accelerator = mode == "accelerator"
  head_dims = {"quick": HEAD_DIMS[:2], "accelerator": ACCELERATOR_HEAD_DIMS}.get(mode, HEAD_DIMS)
  scales = {name: SCALES[name] for name in ACCELERATOR_SCALES} if accelerator else SCALES
  steps = ACCELERATOR_STEPS if accelerator else 600
  rates = LEARNING_RATES[1::3] if mode == "quick" else LEARNING_RATES  # quick: 1e-3 and 1e-1
  sweep = sweep_config(mode, steps=steps, eval_every=100, warmup=60, base=mqar,
                       baseline=f"dk{head_dims[0]}_inv_sqrt", test="time_to_solve",
                       contrasts=((f"dk{head_dim}_{name}", f"dk{head_dim}_inv_sqrt")
                                  for head_dim in head_dims for name in scales
                                  if name != "inv_sqrt"),
                       variants=((f"dk{head_dim}_{name}", {"model": {"head_dim": head_dim, **model}})
                                 for head_dim in head_dims for name, model in scales.items()),
                       seeds=ACCELERATOR_SEEDS if accelerator else NUM_SEEDS, learning_rates=rates,
                       predictions=("configs/ablations/scaling.py:accelerator" if accelerator
                                    else ""))
  sweep.train.model.num_heads = 1
  return sweep


def predictions(mode=None) -> dict:
  """The predictions of ``:accelerator``, fixed before the sweep ran (python -m
  experiments.findings): the test error, 1 - accuracy, at each arm's rate chosen on the
  validation stream or at the grid's largest, paired by seed.

  - S1 (Vaswani et al. 2017, footnote 4): without the 1/sqrt(d_k) the logits' variance grows
    with d_k, the softmax saturates and learning suffers: at d_k 256 and 1024 no scaling errs
    more than 1/sqrt(d_k).
  - S2: that penalty grows with d_k: (none - 1/sqrt(d_k)) at d_k 1024 above the same at d_k 64.
  - S3 (Wortsman et al. 2023): at the largest learning rate QK-norm errs less than 1/sqrt(d_k)
    alone, at every d_k.
  - S4: QK-norm costs nothing once the learning rate is tuned: within 0.05 of 1/sqrt(d_k) at
    every d_k, by TOST.
  """
  check_mode(mode, ("accelerator",))
  dims = ACCELERATOR_HEAD_DIMS
  error = {"column": "eval_accuracy", "read": "error"}
  largest = {"measure": "largest"}
  return {
      "setting": "learning rate",
      "measures": {"primary": {**error, "differences": {f"gap_{d}": (f"dk{d}_none",
                                                                     f"dk{d}_inv_sqrt")
                                                        for d in dims}},
                   "largest": {**error, "rate": max(LEARNING_RATES)}},
      "predictions": (
          ("S1", "chosen", tuple(("above", f"dk{d}_none", f"dk{d}_inv_sqrt") for d in dims[1:])),
          ("S2", "chosen", (("above", f"gap_{dims[-1]}", f"gap_{dims[0]}"),)),
          ("S3", "largest", tuple(("above", f"dk{d}_inv_sqrt", f"dk{d}_qk_norm", largest)
                                  for d in dims)),
          ("S4", "chosen", tuple(("within", f"dk{d}_qk_norm", f"dk{d}_inv_sqrt", 0.05)
                                 for d in dims)),
      )}
