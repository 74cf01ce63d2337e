"""The scale, apart from the optimiser and the width: is 1/sqrt(d_k) a statement about the
logits, or about W_Q's learning rate under Adam? And do muP's 1/d_k and a learned QK-norm gain do
what their papers say?

  python -m experiments.sweep --config=configs/ablations/scale_optimiser.py:adam_dk16 \
      --workdir=/work/runs/scale_optimiser/adam_dk16   # and adam_dk64, sgd_dk16, ... (below)
  python -m experiments.sweep --config=configs/ablations/scale_optimiser.py:sgd \
      --workdir=/work/runs/scale_optimiser/sgd
  python -m experiments.sweep --config=configs/ablations/scale_optimiser.py:mup \
      --workdir=/work/runs/scale_optimiser/mup
  python -m experiments.sweep --config=configs/ablations/scale_optimiser.py:accelerator \
      --workdir=/work/runs/scale_optimiser/accelerator
  python -m experiments.sweep --config=configs/ablations/scale_optimiser.py:quick --workdir=/tmp/so

The model and task are configs/ablations/scaling_init.py's (MQAR, configs/mqar.py: 2 layers, 4
heads, RoPE, residual stream 64, d_k set by model.head_dim), 1200 steps (sgd_unscaled 3000),
gradient clipping off (a global-norm clip is not invariant to reparametrising W_Q, so it would break
the positive controls). The logit scale s multiplies q.k; writing W_Q = s W_Q' turns it into an
unscaled model whose W_Q starts s times smaller and, under Adam (updates of about the rate per entry
whatever the gradient's scale), learns at s times the rate; under SGD, where the update is the
gradient times the rate, at s^2 times the rate (the gradient of W_Q' is s times W_Q's and its update
reaches W_Q times s again). So the arms, at d_k 16 and 64:

- ``inv_sqrt``: q.k / sqrt(d_k), the paper's (the baseline of adam, sgd and mup);
- ``none``: q.k, unscaled (W_Q's initial values and its rate both s^-1 times the paper's);
- ``none_qlr_half``: unscaled, W_Q initialised x d_k^-1/2 and its rate x d_k^-1/2
  (config.query_lr_scale): under Adam the paper's arm up to Adam's epsilon and weight decay (a
  positive control); under SGD not, since SGD needs the rate x d_k^-1;
- ``none_qlr_full`` (SGD only): W_Q initialised x d_k^-1/2 and its rate x d_k^-1: under SGD with
  momentum the paper's arm exactly, up to weight decay (the SGD positive control);
- ``inv_sqrt_qup_half``, ``inv_sqrt_qup_full`` (sgd_unscaled): the same two controls the other
  way, the paper's scale with W_Q initialised x d_k^1/2 and its rate x d_k^1/2 (Adam's) or x d_k
  (SGD's: the unscaled model exactly, with weight decay 0), against ``none`` as the baseline;
- ``qk_norm_learned`` (Adam only): L2-normalised queries and keys times a learned gain started at
  log2(L^2 - L) (Henry et al. 2020; attention_jax/variants/qk_norm_learned.py), L the task's
  sequence length (task_options.length of configs/mqar.py, 8: g0 = log2(56), 5.8).

Modes (each sized to at most 30 minutes on the 2 CPU cores; the sweep refuses a design whose
seeds and test cannot reach alpha):

- ``adam`` (AdamW, rates 3e-4, 1e-3, 3e-3 bracketed): inv_sqrt, none, none_qlr_half,
  qk_norm_learned at d_k 16 and 64;
- ``sgd`` (SGD with momentum 0.9, rates 1e-2, 3e-2, 1e-1 bracketed): inv_sqrt, none,
  none_qlr_half, none_qlr_full at d_k 16 and 64;
- ``sgd_unscaled`` (SGD with momentum 0.9, rates 1e-3, 3e-3, 1e-2, not bracketed, so that it
  runs as rate splits; 3000 steps; weight decay 0): none (the baseline: the one arm that
  learned under SGD), inv_sqrt, inv_sqrt_qup_half, inv_sqrt_qup_full at d_k 16 and 64;
- ``mup`` (AdamW, rates 1e-4 .. 1e-2 in half decades, not bracketed: the position of the best
  rate in the grid is the measure): inv_sqrt and muP's 1/d_k (``inv``, Yang et al. 2022) at d_k
  16, 64 and 256;
- ``adam_dk16``, ``adam_dk64``, ``sgd_dk16``, ``sgd_unscaled_dk16``, ..., ``mup_dk256``: one d_k of
  a mode, one sweep each: a whole mode is more than 30 minutes on the 2 shared cores (one arm of
  adam at d_k 64, 30 replicas, ran at about 3 steps a second under load: about 7 minutes an arm), so
  the CPU study runs as these splits, each split's predictions the rows at its d_k;
- ``mup_dk256_lr1e-4``, ..., ``mup_dk256_lr1e-2`` (RATE_SPLITS): d_k 256 at one rate each (its
  projections are four times d_k 64's, and d_k 64 took most of a half hour at three rates); and
  ``sgd_unscaled_dk16_lr1e-3``, ..., ``sgd_unscaled_dk64_lr1e-2`` (four arms of 3000 steps);
  then ``python -m experiments.sweep_report --merge=<dir>/mup_dk256/results.csv --from_csv
  <each part's results.csv>`` writes the one results.csv (and report) that findings reads;
- ``accelerator``: the adam mode's arms on one GPU, d_k 64, 256 and 1024, 2000 steps;
- ``quick``: a smoke test of the pipeline.

Measure: the steps a seed takes to reach 0.9 test accuracy (censored one evaluation past the
end), each arm at its rate chosen on the validation stream, paired by seed; 10 seeds, whose exact
paired test's smallest p (2/1024) survives Holm over the family. Wortsman et al. (2023): runs whose
largest attention logit passes about 1e4 diverge; every run records its peak largest logit
(peak_max_attention_logit) and where it diverged (diverged_at): the page tabulates the two.
Rate transfer (mup mode): per d_k and arm, the index in the grid of the rate with the best mean
validation accuracy over the seeds (drawn: study_figures.rate_transfer); "transfers" is decided
by the per-seed best-rate index (the rate with the seed's best validation accuracy; ties, as at
accuracy 1, to the lower validation loss, as the sweeps' own rate choice breaks them): a
Friedman test (scipy.stats.friedmanchisquare) across the three d_k, seeds as blocks, per arm;
1/d_k transfers when that test does not reject at 0.05 and the mean over seeds of that index
moves by at most one grid step between 16 and 256; 1/sqrt(d_k) does not when it rejects (M2,
M3; findings' rate_transfers). Not rejecting is not an equivalence test, and a rejection does
not size the move: the page reads both beside the figure. Predictions, committed before
any full run: ``predictions`` below (python -m experiments.findings).
"""

from configs import mqar
from configs.ablations import check_mode, sweep_config

SPLITS = {"adam": (16, 64), "sgd": (16, 64), "sgd_unscaled": (16, 64), "mup": (16, 64, 256)}
#: a d_k too slow for one half-hour sweep: its grid split further, a rate per sweep
RATE_SPLITS = {"mup_dk256": ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2"),
               **{f"sgd_unscaled_dk{d}": ("1e-3", "3e-3", "1e-2") for d in (16, 64)}}
#: each design whole, or one d_k of it ("adam_dk64"): one d_k is one sweep of at most 30 minutes,
#: or one rate of it ("mup_dk256_lr3e-4"), the parts merged into one results.csv after
MODES = ("adam", "sgd", "sgd_unscaled", "mup", "quick", "accelerator") + tuple(
    f"{base}_dk{d}" for base, dims in SPLITS.items() for d in dims) + tuple(
    f"{split}_lr{rate}" for split, rates in RATE_SPLITS.items() for rate in rates)
HEAD_DIMS = {**SPLITS, "quick": (16,)}
#: each design's arms, its baseline first
ARMS = {"adam": ("inv_sqrt", "none", "none_qlr_half", "qk_norm_learned"),
        "sgd": ("inv_sqrt", "none", "none_qlr_half", "none_qlr_full"),
        "sgd_unscaled": ("none", "inv_sqrt", "inv_sqrt_qup_half", "inv_sqrt_qup_full"),
        "mup": ("inv_sqrt", "inv"), "quick": ("inv_sqrt", "none_qlr_half", "qk_norm_learned")}
LEARNING_RATES = {"adam": (3e-4, 1e-3, 3e-3), "sgd": (1e-2, 3e-2, 1e-1),
                  "sgd_unscaled": (1e-3, 3e-3, 1e-2),
                  "mup": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), "quick": (1e-3,)}
OPTIMIZER = {"sgd": "sgd", "sgd_unscaled": "sgd"}
STEPS, EVAL_EVERY, NUM_SEEDS = 1200, 100, 10
#: a design's own steps, weight decay and rates added past the grid's edge (bracket), where not
#: STEPS, the config's 0.01 and 2
DESIGN_STEPS, WEIGHT_DECAY, BRACKET = {"sgd_unscaled": 3000}, {"sgd_unscaled": 0.0}, {
    "mup": 0, "sgd_unscaled": 0}
ACCELERATOR_HEAD_DIMS, ACCELERATOR_STEPS = (64, 256, 1024), 2000
MARGIN = 100  # steps: one evaluation interval, the resolution of the measure


def model_overrides(arm: str, head_dim: int, length: int) -> dict:
  """The model settings of ``arm`` at d_k = ``head_dim`` (sequence length ``length``)."""
  return {"inv_sqrt": {}, "none": {"attention_scale": "none"}, "inv": {"attention_scale": "inv"},
          "none_qlr_half": {"attention_scale": "none", "query_init_scale": head_dim ** -0.5},
          "none_qlr_full": {"attention_scale": "none", "query_init_scale": head_dim ** -0.5},
          "inv_sqrt_qup_half": {"query_init_scale": head_dim ** 0.5},
          "inv_sqrt_qup_full": {"query_init_scale": head_dim ** 0.5},
          "qk_norm_learned": {"head_variant": "qk_norm_learned",
                              "head_variant_options": {"length": length}}}[arm]


def query_rate(arm: str, head_dim: int) -> float:
  """The factor on W_Q's learning rate (experiments/optim.py, query_lr_scale)."""
  return {"none_qlr_half": head_dim ** -0.5, "none_qlr_full": 1.0 / head_dim,
          "inv_sqrt_qup_half": head_dim ** 0.5, "inv_sqrt_qup_full": float(head_dim)}.get(arm, 1.0)


def name(arm: str, head_dim: int) -> str:
  return f"dk{head_dim}_{arm}"


def variant(arm, head_dim, length):
  return (name(arm, head_dim), {"model": {"head_dim": head_dim,
                                          **model_overrides(arm, head_dim, length)},
                                "query_lr_scale": query_rate(arm, head_dim)})


def design(mode):
  """(the optimiser design, its d_k, its steps) of ``mode``."""
  mode = mode or "adam"
  if mode == "accelerator":
    return "adam", ACCELERATOR_HEAD_DIMS, ACCELERATOR_STEPS
  base, _, head_dim = mode.split("_lr")[0].partition("_dk")
  return base, (int(head_dim),) if head_dim else HEAD_DIMS[base], DESIGN_STEPS.get(base, STEPS)


def learning_rates(mode) -> tuple[float, ...]:
  """The grid ``mode`` trains: its design's, or one rate of it for a rate split."""
  split, _, rate = (mode or "adam").partition("_lr")
  return (float(rate),) if rate else LEARNING_RATES[design(split)[0]]


def get_config(mode="adam"):
  check_mode(mode, MODES)
  mode = mode or "adam"
  base, head_dims, steps = design(mode)
  length = mqar.get_config().task_options.length
  arms = ARMS[base]
  sweep = sweep_config(
      "quick" if mode == "quick" else None,
      steps=steps, eval_every=EVAL_EVERY,
      warmup=60, base=mqar, baseline=name(arms[0], head_dims[0]), test="time_to_solve",
      bracket=BRACKET.get(base, 2),
      contrasts=((name(arm, d), name(arms[0], d)) for d in head_dims for arm in arms[1:]),
      variants=(variant(arm, d, length) for d in head_dims for arm in arms),
      seeds=NUM_SEEDS, learning_rates=learning_rates(mode),
      predictions=f"configs/ablations/scale_optimiser.py:{mode}")
  sweep.train.grad_clip_norm = 0.0
  sweep.train.optimizer = OPTIMIZER.get(base, "adamw")
  sweep.train.momentum = 0.9
  sweep.train.weight_decay = WEIGHT_DECAY.get(base, sweep.train.weight_decay)
  sweep.train.query_lr_scale = 1.0
  return sweep


def predictions(mode="adam") -> dict:
  """The predictions, fixed before any full run (python -m experiments.findings): steps to 0.9
  test accuracy, each arm at its rate chosen on the validation stream, paired by seed; "above"
  means more steps; "within" a margin of MARGIN steps, by TOST.

  adam:
  - A1 (the positive control; Adam is invariant to the gradient's scale): none_qlr_half within
    MARGIN of inv_sqrt at d_k 16 and 64: the 1/sqrt(d_k) is W_Q's initial scale and rate.
  - A2 (Vaswani et al. 2017, footnote 4): none above inv_sqrt at d_k 64.
  - A3 (Henry et al. 2020: a gain started at log2(L^2 - L) is sharp enough from step 0, unlike
    LayerNorm gains at 1): qk_norm_learned within MARGIN of inv_sqrt at d_k 16 and 64.
  sgd:
  - S1 (the exact reparametrisation under SGD): none_qlr_full within MARGIN of inv_sqrt at both.
  - S2 (initialisation and rate do not commute under SGD: Adam's control is wrong here):
    none_qlr_half above inv_sqrt at d_k 64.
  sgd_unscaled (declared after sgd_dk16, where no arm learned, and a pilot of one seed range:
  under SGD the paper's arm stayed at the plateau at every rate from 1e-3 to 0.2 over 4000
  steps, while the unscaled model at 3e-3 reached 0.9 in 5 of 7 seeds within 2400; so the
  baseline is the arm that learns, none, and the controls reparametrise the paper's arm into
  it; weight decay 0, which makes U1 exact up to rounding):
  - U1 (the exact reparametrisation under SGD): inv_sqrt_qup_full (W_Q initialised x d_k^1/2,
    its rate x d_k) within MARGIN of none at d_k 16 and 64.
  - U2 (initialisation and rate do not commute under SGD): inv_sqrt_qup_half (W_Q initialised
    x d_k^1/2, its rate x d_k^1/2: Adam's control) above none at d_k 16 and 64.
  - U3 (the pilot's finding, now tested): inv_sqrt above none at d_k 16 and 64.
  mup (Yang et al. 2022):
  - M1 (1/d_k trains as well at its own best rate): inv within MARGIN of inv_sqrt at d_k 16
    and 64.
  - M2, M3 (the rate transfer, by the module docstring's Friedman rule, at alpha unadjusted):
    1/d_k's best rate transfers across d_k 16, 64 and 256 (M2) and 1/sqrt(d_k)'s does not (M3).
  Every mode, the design D: the baseline (inv_sqrt; none in sgd_unscaled) reaches 0.95 in
  every seed, every chosen rate inside the rates tried (adam, sgd, sgd_unscaled: the code
  checks every design but mup's, as it did when sgd_unscaled was declared); Wortsman et al.'s threshold is read descriptively on the page.
  """
  base, head_dims, steps = design(mode)
  # the d_k of A2 and S2: 64 (1024 on the accelerator), in the split that holds it
  large = head_dims[-1] if mode == "accelerator" else max(SPLITS.get(base, head_dims)[:2])
  both = tuple(sorted(set(head_dims) & set(SPLITS["mup"][:2]))) if base == "mup" else head_dims
  at = ", ".join(map(str, both))
  baseline = ARMS[base][0]
  the_design = tuple(("reaches", name(baseline, d), 0.95, {"measure": "accuracy"})
                 for d in head_dims) + ((("rates_inside",),) if base != "mup" else ())

  def within(arm, dims):
    return tuple(("within", name(arm, d), name(baseline, d), MARGIN) for d in dims)

  def above(arm, dims=(large,)):
    return tuple(("above", name(arm, d), name(baseline, d)) for d in dims)

  has_large = large in head_dims
  rows = {"adam": (("A1", f"d_k {at}", within("none_qlr_half", both)),)
                  + ((("A2", f"d_k {large}", above("none")),) if has_large else ())
                  + (("A3", f"d_k {at}", within("qk_norm_learned", both)),),
          "sgd": (("S1", f"d_k {at}", within("none_qlr_full", both)),)
                 + ((("S2", f"d_k {large}", above("none_qlr_half")),) if has_large else ()),
          "sgd_unscaled": (("U1", f"d_k {at}", within("inv_sqrt_qup_full", both)),
                           ("U2", f"d_k {at}", above("inv_sqrt_qup_half", both)),
                           ("U3", f"d_k {at}", above("inv_sqrt", both))),
          "mup": ((("M1", f"d_k {at}", within("inv", both)),) if both else ())
                 + tuple((label, "d_k " + ", ".join(map(str, SPLITS["mup"])),
                          (("rate_transfers", tuple(name(arm, d) for d in SPLITS["mup"]),
                            transfers),))
                         for label, arm, transfers in (("M2", "inv", True),
                                                       ("M3", "inv_sqrt", False)))}
  return {
      **({"figure": "rate_transfer"} if base == "mup" else {}),
      "setting": "arms",
      "measures": {
          "primary": {"column": "steps_to_threshold", "read": "steps",
                      "censored_at": steps + EVAL_EVERY},
          "accuracy": {"column": "eval_accuracy"}},
      "predictions": (("D", "design", the_design),) + rows[base]}
