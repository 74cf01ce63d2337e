"""Heads against width and length: Yu et al.'s claim itself. Below D heads, does the width a
one-layer transformer needs grow with the sequence length T, and from D on, not?

  python -m experiments.sweep --config=configs/ablations/heads_width.py:d32 \
      --workdir=workdir/ablations/heads_width/d32   # and every other mode of MODES, one sweep each
  python -m experiments.sweep --config=configs/ablations/heads_width.py:farthest_point \
      --workdir=workdir/ablations/heads_width/farthest_point
  python -m experiments.sweep --config=configs/ablations/heads_width.py:d32_quick --workdir=/tmp/hw
  python -m experiments.sweep --config=configs/ablations/heads_width.py:accelerator \
      --workdir=workdir/ablations/heads_width/accelerator
  python -m experiments.findings --config=configs/ablations/heads_width.py \
      --results=workdir/ablations/heads_width/d32/results.csv \
      --results=workdir/ablations/heads_width/d64/results.csv ...   # every mode's results.csv, once

Yu et al. (2025, arXiv 2510.06662, Fig. 1) train one attention layer to retrieve D maxima
max_s <w_i, x_s> at hidden size 32 and T = 8-128: the NMSE drops sharply at h ~ D, and they
prove that below D the parameters needed grow with T, from D on they do not.
configs/ablations/heads_length.py varied T at one width; this study varies the width too:
multi_retrieval (configs/multi_retrieval.py, D = 4 maxima of T vectors in [0, 1]^8), one layer,
d_model in WIDTHS (the MLP at twice the width, heads of d_k = d_model / h) at h = 2 and h = 4 and
T in LENGTHS, where a cell fits the 2-core budget (CPU_CELLS: d_model 64 at T = 128 and
d_model 128 from T = 64 would take over 30 minutes an arm on the shared cores, and are left to
the accelerator preset). Beside every (d_model, h) curve the page plots the idealised
reference of experiments/retrieval_reference.py: a model that retrieves h of the maxima exactly
and regresses the others on them by least squares.

The farthest-point control separates the width from the rank (mode ``farthest_point``, the task
and training of configs/ablations/farthest_floor.py: d = 16, 3000 steps, one layer): one head of
d_k 16 = d (full rank) at d_model 48, against one head of d_k 48 at d_model 48 (the same width, a
larger head) and one head of d_k 16 at d_model 16 (the same head, the narrow stream of the first
farthest-point study).

Modes (MODES), one sweep each, each estimated at under 30 minutes on the 2 shared CPU cores
(from the d32 arms' own times on them and 100-step smoke runs of the d_model 64 and 128 arms at
their longest T; the modes of one cell are those of about 15-25 minutes an arm): every arm
trains NUM_SEEDS seeds x LEARNING_RATES as one vmapped program, STEPS steps at batch BATCH_SIZE,
extended by one rate past an edge where the validation stream's choice sits. A mode's comparisons
(its primary family) are h = 2 against h = 4 at each of its (d_model, T), paired by seed (arms at
one T see the same data). ``<mode>_quick``: that mode at a tenth of the steps, 2 seeds, 2 rates
(a smoke test; ``quick`` is ``d32_quick``). ``accelerator``: every cell of WIDTHS x (2, 4) x
the lengths of ACCELERATOR (T up to 256) in one sweep for one GPU, with more seeds and steps; the
farthest-point mode runs as it is beside it.

Predictions (``predictions`` below), committed before any full run; findings reads every mode's
results.csv as one study. Results, runtime and provenance: docs/results/heads_width.md.
"""

from configs import farthest_point, multi_retrieval
from configs.ablations import farthest_floor, sweep_config
from experiments import retrieval_reference

STUDY = "configs/ablations/heads_width.py"  # its predictions, read by experiments.findings
D = 4  # maxima retrieved (configs/multi_retrieval.py)
HEADS = (2, D)  # below D and at D
WIDTHS = (32, 64, 128)
LENGTHS = (8, 32, 64, 128)
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
STEPS, BATCH_SIZE, NUM_SEEDS, NUM_TEST = 1000, 32, 10, 500
# One sweep each: mode -> (d_model, lengths, head counts).
MODES = {
    "d32": (32, (8, 32, 64), HEADS),
    "d32_T128_h2": (32, (128,), (2,)),
    "d32_T128_h4": (32, (128,), (D,)),
    "d64": (64, (8, 32), HEADS),
    "d64_T64_h2": (64, (64,), (2,)),
    "d64_T64_h4": (64, (64,), (D,)),
    "d128_T8": (128, (8,), HEADS),
    "d128_T32_h2": (128, (32,), (2,)),
    "d128_T32_h4": (128, (32,), (D,)),
}
CPU_CELLS = tuple((d, h, t) for d, lengths, heads in MODES.values() for t in lengths
                  for h in heads)
# The accelerator preset: (lengths, steps, batch size, seeds, test examples).
ACCELERATOR = ((8, 32, 64, 128, 256), 3000, 64, 20, 2000)
ACCELERATOR_CELLS = tuple((d, h, t) for d in WIDTHS for t in ACCELERATOR[0] for h in HEADS)

# The farthest-point control: arm -> (d_model, d_k of its one head).
FARTHEST = {"fp_d48_k48": (48, 48), "fp_d48_k16": (48, 16), "fp_d16_k16": (16, 16)}

SOLVED = 0.01   # NMSE: a cell of h = D solved in a seed (W1)
MARGIN = 0.02   # NMSE: from D on, a wider model within this of d_model 32 (TOST)
FARTHEST_MARGIN = 0.05  # NMSE: d_k 16 within this of d_k 48 at d_model 48 (TOST)


def name(d_model: int, heads: int, length: int) -> str:
  return f"d{d_model}_h{heads}_T{length}"


def arm(d_model: int, heads: int, length: int):
  """(name, overrides) of one cell: heads of d_k = d_model / h, the MLP at twice the width."""
  return name(d_model, heads, length), {
      "task_options": {"length": length},
      "model": {"d_model": d_model, "mlp_dim": 2 * d_model, "num_heads": heads, "head_dim": 0}}


def _mode_of(mode) -> tuple[str, bool]:
  """(the sweep a mode names, whether it is its quick smoke test); refuses any other mode."""
  sweeps = (*MODES, "farthest_point")
  if mode not in (*sweeps, *(f"{m}_quick" for m in sweeps), "quick", "accelerator"):
    raise ValueError(f"mode must be one of {list(sweeps)}, '<mode>_quick', 'quick' (d32_quick) "
                     f"or 'accelerator', got {mode!r}.")
  if mode == "quick":
    return "d32", True
  return mode.removesuffix("_quick"), mode.endswith("_quick")


def get_config(mode=None):
  base, quick = _mode_of(mode)
  if base == "farthest_point":
    return farthest_config(quick)
  if base == "accelerator":
    _, steps, batch_size, seeds, num_test = ACCELERATOR
    cells = ACCELERATOR_CELLS
  else:
    d_model, lengths, heads = MODES[base]
    steps, batch_size, seeds, num_test = STEPS, BATCH_SIZE, NUM_SEEDS, NUM_TEST
    cells = tuple((d_model, h, t) for t in lengths for h in heads)
  arms = [arm(*cell) for cell in cells]
  pairs = [(name(d, 2, t), name(d, D, t)) for d, h, t in cells
           if h == 2 and (d, D, t) in cells]
  sweep = sweep_config("quick" if quick else None, steps=steps, eval_every=steps // 5,
                       warmup=100, base=multi_retrieval, variants=arms, baseline=arms[0][0],
                       contrasts=pairs, bracket=1, seeds=seeds,
                       learning_rates=LEARNING_RATES[1:] if quick else LEARNING_RATES,
                       predictions=STUDY + (":accelerator" if base == "accelerator" else ""))
  sweep.train.model.num_layers = 1
  sweep.train.batch_size = batch_size
  if not quick:
    sweep.train.task_options.num_test = num_test
  return sweep


def farthest_config(quick: bool = False):
  """The farthest-point control (FARTHEST) at configs/ablations/farthest_floor.py's training."""
  arms = [(arm_name, {"model": {"d_model": d_model, "num_heads": 1, "head_dim": d_k}})
          for arm_name, (d_model, d_k) in FARTHEST.items()]
  rates = farthest_floor.LEARNING_RATES
  sweep = sweep_config("quick" if quick else None, steps=farthest_floor.STEPS,
                       eval_every=farthest_floor.STEPS // 6, warmup=100, base=farthest_point,
                       variants=arms, baseline="fp_d48_k48",
                       contrasts=(("fp_d48_k16", "fp_d48_k48"), ("fp_d16_k16", "fp_d48_k16")),
                       bracket=1, seeds=NUM_SEEDS, learning_rates=rates[:1] if quick else rates,
                       predictions=STUDY)
  sweep.train.model.num_layers = 1
  return sweep


def _longest(cells, d_model: int, heads: int) -> int:
  """The longest T of the cells at (d_model, heads)."""
  return max(t for d, h, t in cells if d == d_model and h == heads)


def predictions(mode=None) -> dict:
  """The predictions, fixed before any full run (python -m experiments.findings over every
  mode's results.csv): the test NMSE of each arm at its rate chosen on the validation stream.
  In Yu et al.'s terms:

  - W1 (h >= D suffices): at h = D, every width and every T, the NMSE is below SOLVED in every
    seed.
  - W2 (below D the trained model's advantage over the idealised reference shrinks with T): at
    h = 2, at every width, the NMSE less the reference's (measure ``excess``) is higher at the
    longest T than at T = 8 (arms at different T see different data: unpaired, the permutation
    test of the difference of means).
  - W3 (the width needed for a given NMSE rises with T below D and not above it): at h = 2
    every wider model at its longest T errs more than d_model 32 at T = 8 (unpaired), so the
    width that reaches d_model 32's NMSE at T = 8 is larger than that model at that T; at h = D
    every wider model is within MARGIN of d_model 32 at every T (TOST, paired by seed), so
    d_model 32 is all the width any T needs.
  - F (width, not rank, on farthest_point): one head of d_k 16 at d_model 48 is within
    FARTHEST_MARGIN of one of d_k 48 there (TOST), and one head of d_k 16 at d_model 16 errs
    more than at d_model 48 (the exact paired test).

  Every tested check outside a mode's own comparisons is corrected with the others (Holm);
  the sweep refuses seeds too few for them to reach alpha. Written before any run of this study;
  the numbers known then are heads_length's (d_model 32, heads of d_k 32, 500 steps).
  """
  cells = ACCELERATOR_CELLS if mode == "accelerator" else CPU_CELLS
  widths = sorted({d for d, _, _ in cells})
  narrow, wider = widths[0], widths[1:]
  references = {name(d, h, t): retrieval_reference.task_reference(h, t)
                for d, h, t in cells if h < D}
  unpaired = {"paired": False}
  return {
      "setting": "cells",
      "figure": "nmse_by_length_and_width",
      "measures": {"primary": {"column": "eval_nmse"},
                   "excess": {"column": "eval_nmse", "offsets": references}},
      "predictions": (
          ("W1", f"h = {D}, every d_model and T",
           tuple(("below", name(d, D, t), SOLVED, {"every_seed": True})
                 for d, h, t in cells if h == D)),
          ("W2", "h = 2, NMSE above the reference, longest T against 8",
           tuple(("above", name(d, 2, _longest(cells, d, 2)), name(d, 2, 8),
                  {**unpaired, "measure": "excess"}) for d in widths)),
          ("W3", f"h = 2: wider, longest T, against {narrow} at 8; h = {D}: against {narrow}",
           tuple(("above", name(d, 2, _longest(cells, d, 2)), name(narrow, 2, 8), unpaired)
                 for d in wider)
           + tuple(("within", name(d, D, t), name(narrow, D, t), MARGIN)
                   for d, h, t in cells if h == D and d != narrow)),
          ("F", "farthest_point, one head",
           (("within", "fp_d48_k16", "fp_d48_k48", FARTHEST_MARGIN),
            ("above", "fp_d16_k16", "fp_d48_k16"))),
      )}
