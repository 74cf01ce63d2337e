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
solve the task; its predictions, committed before it ran, are ``predictions("controls")`` below
(python -m experiments.findings).

  python -m experiments.sweep --config=configs/ablations/attention_variants.py:controls \
      --workdir=workdir/ablations/attention_variants_controls

`accelerator` is the study sized for one GPU or TPU: the same arms and learning rates, 2000
steps and 10 seeds (enough for its exact tests to reach p < 0.05 after Holm); its predictions,
fixed before it ran, are ``predictions("accelerator")`` below. `quick` is a smoke test of the
pipeline (a tenth of the steps, 2 seeds, two learning rates).
Results, runtime and the comparison with the papers: docs/results/attention_variants.md.
"""

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
                       baseline="mha", contrasts=CONTROL_CONTRASTS, test="time_to_solve",
                       seeds=CONTROL_SEEDS, learning_rates=CONTROL_RATES,
                       predictions="configs/ablations/attention_variants.py:controls")
  return sweep


def get_config(mode=None):
  check_mode(mode, ("quick", "accelerator", "controls"))
  if mode == "controls":
    return controls_config()
  accelerator = mode == "accelerator"
  base = mqar.get_config()
  steps = ACCELERATOR_STEPS if accelerator else STEPS
  return sweep_config(
      mode, steps=steps, eval_every=steps // 8, warmup=100, base=mqar,
      variants=_variants(base.model), baseline="mha", test="solve_rate",
      seeds=ACCELERATOR_SEEDS if accelerator else 3,
      learning_rates=LEARNING_RATES[1:3] if mode == "quick" else LEARNING_RATES,
      predictions="configs/ablations/attention_variants.py:accelerator" if accelerator else "")


def predictions(mode=None) -> dict:
  """The predictions, fixed before the sweeps ran (python -m experiments.findings), paired by
  seed.

  ``controls``: the steps until a seed first reaches test accuracy 0.9 (a seed that never does
  counted one evaluation past the last), each arm at its rate chosen on the validation stream.

  - C1 (the map count, not the subtraction): differential attention with num_heads=4 (8
    softmax maps of width 8) solves the task no sooner than plain attention with 8 heads.
  - C2: differential attention with 2 heads (4 maps of 16, as plain attention's 4 heads) solves
    it no sooner than plain attention with 4 heads.
  - C3 (the gate's start): the paper's gate, which starts at 0.5, solves it later than the same
    gate started open (2 sigmoid(X W), 1 at the start).
  - C4: the gate started open matches plain attention: within one evaluation interval (100
    steps), by TOST.

  ``accelerator`` (the papers' claims): the test error (1 - accuracy) at a fixed rate or at each
  arm's chosen rate, and the attention weight on the first token at the end of training.

  - V1 (Qiu et al. 2025): gating widens the range of learning rates that train: at 1e-2 both
    gates err less than plain attention and than plain attention with as many parameters.
  - V2 (Dehghani et al. 2023, Wortsman et al. 2023): at 3e-2 QK-norm errs less than plain
    attention.
  - V3 (Ramapuram et al. 2024): sigmoid attention with b = -log S matches softmax: within 0.05
    of plain attention's error at the chosen rates, by TOST.
  - V4 (Ye et al. 2025; Qiu et al. 2025): differential attention and the feature-wise gate put
    less weight on the first token than plain attention, at the chosen rates.
  """
  if mode == "controls":
    return {
        "setting": "compared",
        "measures": {"primary": {"column": "steps_to_threshold", "read": "steps",
                                 "censored_at": STEPS + STEPS // 8}},
        "predictions": (
            ("C1", "8 maps of width 8 each", (("not_above", "mha_8", "differential"),)),
            ("C2", "4 maps of width 16 each", (("not_above", "mha", "differential_2"),)),
            ("C3", "the gate's start", (("above", "gated", "gated_open"),)),
            ("C4", "the open gate", (("within", "gated_open", "mha", STEPS // 8),)),
        )}
  error = {"column": "eval_accuracy", "read": "error"}
  at_1e2, at_3e2 = {"measure": "at_1e-2"}, {"measure": "at_3e-2"}
  return {
      "setting": "learning rate",
      "measures": {"primary": error, "at_1e-2": {**error, "rate": 1e-2},
                   "at_3e-2": {**error, "rate": 3e-2},
                   "first_token": {"column": "final_first_token_weight"}},
      "predictions": (
          ("V1", "1e-2", tuple(("above", base, gate, at_1e2) for gate in ("gated", "gated_headwise")
                               for base in ("mha", "mha_matched"))),
          ("V2", "3e-2", (("above", "mha", "qk_norm", at_3e2),)),
          ("V3", "chosen", (("within", "sigmoid", "mha", 0.05),)),
          ("V4", "chosen", tuple(("above", "mha", name, {"measure": "first_token"})
                                 for name in ("differential", "gated"))),
      )}
