"""Head-variants ablation: plain multi-head attention against talking heads, DCMHA, MoH and
overlapping heads (attention_jax/variants/), at 4 and 16 heads (d_k 16 and 4 at d_model 64),
on multi-query associative recall and on a length-generalisation task.

  python -m experiments.sweep --config=configs/ablations/head_variants.py:mqar \
      --workdir=workdir/ablations/head_variants/mqar
  python -m experiments.sweep --config=configs/ablations/head_variants.py:order_4 \
      --workdir=workdir/ablations/head_variants/order_4
  python -m experiments.sweep --config=configs/ablations/head_variants.py:order_16 \
      --workdir=workdir/ablations/head_variants/order_16
  python -m experiments.sweep --config=configs/ablations/head_variants.py:quick --workdir=/tmp/hv

One sweep per task (a sweep's extra test sets apply to every variant, and only `order` has a
longer one), and `order` in two, one per head count, so that each fits the half hour a sweep may
take on 2 CPU cores (all eleven arms in one took 39 minutes, DCMHA at 16 heads 13 of them); the
mode is "mqar", "order_4", "order_16", "quick" (mqar) or "<mode>_quick".

Question: do the published improvements of multi-head attention buy anything on small tasks where
heads matter? Claims: talking heads remove the penalty of many small heads (Shazeer et al. 2020);
DCMHA matches a model trained with 1.7-2x the compute (Xiao et al. 2024); MoH is as good or better
with 50-75% of the heads active per token (Jin et al. 2024; here 75%: N/2 shared + N/4 routed);
overlapping heads give small gains at no change in size (Zhang et al. 2024; overlap = layer index,
so layer 0 is plain MHA). DCMHA's network adds about twice the attention's parameters at 16 heads
and d_model 64, so a plain model with a wider feed-forward and as many parameters
("mha_matched") runs beside it on mqar. Tasks: `mqar` (configs/mqar.py: a lookup per query) and `order`
(is marker A before B) trained at lengths up to 16 and tested at 17-32, both with RoPE, each
variant over a learning-rate grid (4 rates for mqar; for order the 3 its variants chose from,
extended past an edge where a choice sits on one) x 10 seeds.

`quick` is a smoke test of the pipeline (a tenth of the steps, 2 seeds, two learning rates).
Runtime, results and the comparison with the papers: docs/results/head_variants.md.
"""

import math

from attention_jax import variants
from configs import mqar
from configs.ablations import sweep_config

HEADS = (4, 16)
VARIANTS = ("mha", "talking_heads", "dcmha", "moh", "overlap")
LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2)
# order: the three rates the variants chose from in the first run; the sweep adds a rate past an
# edge where a variant's choice sits on one (sweep.bracket), which keeps it within 30 minutes
ORDER_RATES = LEARNING_RATES[:3]
ORDER = {"max_length": 16, "num_fillers": 16}  # trained at lengths 2..16
TEST_LENGTHS = (17, 32)
STEPS = {"mqar": 800, "order": 600}
LONGER = f"length_{TEST_LENGTHS[0]}_{TEST_LENGTHS[1]}"  # the extra test set of `order`

# Seeds per arm: enough for the exact tests of the report to reach p < 0.05 after Holm over
# the study's comparisons (experiments/statistics.py, smallest_p).
NUM_SEEDS = 10


def matched_mlp_dim(d_model: int, mlp_dim: int, num_heads: int, variant: str) -> int:
  """The feed-forward width at which a plain model has as many parameters per layer as ``variant``
  at ``mlp_dim`` (one hidden unit costs 2 * d_model + 1)."""
  specs = variants.get(variant).params(in_features=d_model, num_heads=num_heads,
                                       head_dim=d_model // num_heads)
  added = sum(math.prod(shape) for shape, _ in specs.values())
  return mlp_dim + round(added / (2 * d_model + 1))


# The sweeps: mode -> (task, head counts, with the parameter-matched plain model).
SWEEPS = {"mqar": ("mqar", HEADS, True), "order_4": ("order", HEADS[:1], False),
          "order_16": ("order", HEADS[1:], False)}


def _variants(model, heads_counts, matched):
  for heads in heads_counts:
    for name in VARIANTS:
      yield f"{name}_{heads}", {"model": {"num_heads": heads, "head_variant": name}}
  if matched:
    wide = matched_mlp_dim(model.d_model, model.mlp_dim, HEADS[-1], "dcmha")
    yield f"mha_matched_{HEADS[-1]}", {"model": {"num_heads": HEADS[-1], "mlp_dim": wide}}


def _contrasts(heads_counts, matched):
  """Each variant against plain attention at its head count; the parameter-matched plain model
  against plain attention and against DCMHA, whose size it matches."""
  for heads in heads_counts:
    for name in VARIANTS[1:]:
      yield f"{name}_{heads}", f"mha_{heads}"
  if matched:
    yield f"mha_matched_{HEADS[-1]}", f"mha_{HEADS[-1]}"
    yield f"dcmha_{HEADS[-1]}", f"mha_matched_{HEADS[-1]}"


def get_config(mode=None):
  sweep_name = "mqar" if mode in (None, "quick") else (mode or "").removesuffix("_quick")
  quick = "quick" if mode == "quick" or (mode or "").endswith("_quick") else None
  if sweep_name not in SWEEPS:
    raise ValueError(f"mode must be one of {list(SWEEPS)}, 'quick' or '<mode>_quick', got "
                     f"{mode!r}.")
  task, heads_counts, matched = SWEEPS[sweep_name]
  base = mqar.get_config()
  extra_evals = {LONGER: {
      "min_length": TEST_LENGTHS[0], "max_length": TEST_LENGTHS[1], "num_train": 1}}
  # order is judged on its final accuracy: evaluations every 200 steps halve their cost
  sweep = sweep_config(quick, steps=STEPS[task], eval_every=200 if task == "order" else 100,
                       warmup=100, base=mqar,
                       variants=_variants(base.model, heads_counts, matched),
                       baseline=f"mha_{heads_counts[0]}",
                       contrasts=_contrasts(heads_counts, matched),
                       # order: every variant solves the training lengths; what tells them
                       # apart is the accuracy on the longer sequences
                       test="paired_permutation" if task == "order" else "time_to_solve",
                       primary=f"{LONGER}_accuracy" if task == "order" else "",
                       extra_evals=extra_evals if task == "order" else None, seeds=NUM_SEEDS,
                       learning_rates=(LEARNING_RATES[1:3] if quick else
                                       ORDER_RATES if task == "order" else LEARNING_RATES))
  if task == "order":
    options = sweep.train.task_options
    sweep.train.task = "order"
    sweep.train.task_options = {**ORDER, "num_train": options.num_train,
                                "num_test": min(options.num_test, 1000)}
    sweep.train.model.max_length = TEST_LENGTHS[1]
    sweep.train.model.pooling = "cls"
  return sweep
