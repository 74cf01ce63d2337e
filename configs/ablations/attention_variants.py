"""Attention variants of 2024-25 against plain multi-head attention, on what small models can show
of their papers' claims: tolerance of the learning rate, the attention mass on the first token,
the largest activation and attention logit, and accuracy at the best learning rate.

  python -m experiments.sweep --config=configs/ablations/attention_variants.py \
      --workdir=workdir/ablations/attention_variants
  python -m experiments.sweep --config=configs/ablations/attention_variants.py:quick \
      --workdir=/tmp/attention_variants
  python -m experiments.sweep --config=configs/ablations/attention_variants.py:accelerator \
      --workdir=workdir/ablations/attention_variants_accelerator

Claims (each variant is a plug-in of attention_jax/variants/):
- gated attention (Qiu et al. 2025; "gated" per feature, "gated_headwise" per head): training
  tolerates larger learning rates, the first token stops being an attention sink, the largest
  activations shrink;
- sigmoid attention (Ramapuram et al. 2024, b = -log S): matches softmax attention;
- attention sinks (GPT-OSS): a learned logit per head takes the mass a head would park on the
  first token;
- differential attention (Ye et al. 2025): less attention noise and smaller activation outliers;
- QK-norm (Dehghani et al. 2023; Wortsman et al. 2023), as "qk_norm": the attention logits stay
  small and the loss tolerates larger learning rates.
The feature-wise gate adds d_model x d_model parameters per layer; "mha_matched" is plain
attention with the feed-forward widened to as many parameters. The task is 2-pair MQAR
(configs/mqar.py: 2 layers, d_model 64, 4 heads, RoPE), where plain attention solves the task at
1e-3 and 3e-3 and fails at 1e-2: room for a variant to widen the range. Every variant trains
3 seeds x 4 learning rates as one vmapped program; the learning rate of each is chosen on a
validation stream (another data seed's test split), and the test set reports it.

`controls` separates two effects the first run could not (docs/results/attention_variants.md,
"Controls"): differential attention with num_heads=4 runs 8 softmax maps of width 8 against
plain attention's 4 of 16, so it is run beside plain attention with 8 heads (8 maps of 8) and
differential attention with 2 heads (4 maps of 16); the paper's gate starts at sigmoid(0) = 0.5,
halving each head's output, so it is run beside the same gate started open (gated_open,
2 sigmoid(X W), 1 at the start). 10 seeds x the two rates where plain attention learned (the
grid extended where a chosen rate sits at its edge), each arm compared by the steps it takes to
solve the task; its predictions, committed before it ran, are checked by
scripts/attention_variants_controls_predictions.py.

  python -m experiments.sweep --config=configs/ablations/attention_variants.py:controls \
      --workdir=workdir/ablations/attention_variants_controls

`accelerator` is the study sized for one GPU or TPU: the same arms and learning rates, 2000
steps and 10 seeds (enough for its exact tests to reach p < 0.05 after Holm); its predictions,
fixed before it ran, are checked by scripts/attention_variants_predictions.py. `quick` is a smoke test of the pipeline (a tenth of
the steps, 2 seeds, two learning rates).
Results, runtime and the comparison with the papers: docs/results/attention_variants.md.
"""

import ml_collections

from configs import mqar
from configs.ablations import check_mode, sweep_config
from configs.ablations.head_variants import matched_mlp_dim

VARIANTS = ("mha", "gated", "gated_headwise", "sinks", "sigmoid", "differential")
LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2)
STEPS = 800
ACCELERATOR_STEPS, ACCELERATOR_SEEDS = 2000, 10
# The controls: name -> model overrides, the comparisons (arm, reference), rates and seeds.
CONTROLS = {
    "mha": {},                                                           # 4 maps of width 16
    "mha_8": {"num_heads": 8},                                           # 8 maps of width 8
    "differential": {"head_variant": "differential"},                    # 8 maps of width 8
    "differential_2": {"head_variant": "differential", "num_heads": 2},  # 4 maps of width 16
    "gated": {"head_variant": "gated"},                                  # starts at 0.5
    "gated_open": {"head_variant": "gated_open"},                        # starts at 1
}
CONTROL_CONTRASTS = (("differential", "mha"), ("mha_8", "mha"), ("differential", "mha_8"),
                     ("differential_2", "mha"), ("gated", "mha"), ("gated_open", "mha"),
                     ("gated", "gated_open"))
CONTROL_RATES, CONTROL_SEEDS = (1e-3, 3e-3), 10


def _variants(model):
  for name in VARIANTS:
    yield name, {"model": {"head_variant": name}}
  yield "qk_norm", {"model": {"normalize_qk": True}}
  wide = matched_mlp_dim(model.d_model, model.mlp_dim, model.num_heads, "gated")
  yield "mha_matched", {"model": {"mlp_dim": wide}}


def controls_config():
  """The controls of the differential and gated arms (the module docstring)."""
  sweep = sweep_config(None, steps=STEPS, eval_every=STEPS // 8, warmup=100, base=mqar,
                       variants=((name, {"model": dict(model)}) for name, model in
                                 CONTROLS.items()),
                       baseline="mha", contrasts=CONTROL_CONTRASTS, test="time_to_solve")
  sweep.num_seeds = CONTROL_SEEDS
  sweep.grid = ml_collections.ConfigDict({"learning_rate": CONTROL_RATES})
  return sweep


def get_config(mode=None):
  check_mode(mode, ("quick", "accelerator", "controls"))
  if mode == "controls":
    return controls_config()
  accelerator = mode == "accelerator"
  base = mqar.get_config()
  steps = ACCELERATOR_STEPS if accelerator else STEPS
  sweep = sweep_config(mode, steps=steps, eval_every=steps // 8, warmup=100, base=mqar,
                       variants=_variants(base.model), baseline="mha",
                       test="solve_rate")
  if accelerator:
    sweep.num_seeds = ACCELERATOR_SEEDS
  rates = LEARNING_RATES[1:3] if mode == "quick" else LEARNING_RATES
  sweep.grid = ml_collections.ConfigDict({"learning_rate": rates})
  return sweep
