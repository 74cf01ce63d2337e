"""Heads and sequence length: h heads of a fixed size on multi_retrieval (D = 4 maxima) at
sequence lengths T = 8, 32 and 64, one attention layer.

  python -m experiments.sweep --config=configs/ablations/heads_length.py \
      --workdir=workdir/ablations/heads_length
  python -m experiments.sweep --config=configs/ablations/heads_length.py:quick --workdir=/tmp/hl
  python -m experiments.sweep --config=configs/ablations/heads_length.py:accelerator \
      --workdir=workdir/ablations/heads_length_accelerator
  python scripts/heads_length_probe.py --sweep=workdir/ablations/heads_length  # which head
                                                                               # finds which max

Question: Yu et al. (2025, arXiv 2510.06662) prove that a one-layer transformer retrieving D
maxima max_s <w_i, x_s> needs h >= D heads, and that below D the parameters it needs grow with
the sequence length (their Fig. 1 sweeps T = 8-128). configs/ablations/heads_binding.py found the
step at h = D at one length (T = 16); this sweep varies T. Predicted (``predictions``
below, committed before the run): below D the test NMSE rises with T;
from h = D it stays near zero at every T; h = 3 tells a step at D (three heads as far from
solving as fewer) from a decline in proportion to the heads missing.

Every arm has heads of d_k = d_model = 32 (the fixed head size of heads_binding, so that h = 3
needs no width divisible by 3), h in 1, 2, 3, 4 at every T: 12 arms, 6 seeds x 3 learning
rates each, 500 steps at batch 32: 9.7 minutes on 2 CPU cores (sized by a trial that ran beside
another sweep and looked three times slower, which left h = 8 out; the accelerator preset has it).
Arms at different T see different data, so every comparison is unpaired (the permutation test
of the difference of means: with 6 seeds a clean separation gives p = 2 / C(12, 6) = 0.002,
which survives Holm over the 6 comparisons). The learning rate of each arm is chosen on a
validation stream over a grid of three, extended by one rate past an edge where the choice sits
on one. Results, runtime and provenance: docs/results/heads_length.md.

`:accelerator` is the study sized for one GPU or TPU: T up to 128 (Yu et al.'s widest), h = 8
beside 1-4, 10 seeds, 2000 steps at batch 64 on 2000 test examples per length; the same
predictions apply at the lengths and heads it runs (``predictions("accelerator")``).
"""

from configs import multi_retrieval
from configs.ablations import check_mode, sweep_config

HEADS = (1, 2, 3, 4)
LENGTHS = (8, 32, 64)
D = 4  # maxima retrieved (configs/multi_retrieval.py)
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
STEPS, BATCH_SIZE = 500, 32
NUM_SEEDS = 6
NUM_TEST = 500  # examples in the test set and in the validation stream, per length
# The accelerator preset: (head counts, lengths, steps, batch size, seeds, test examples).
ACCELERATOR = ((1, 2, 3, 4, 8), (8, 32, 64, 128), 2000, 64, 10, 2000)


def name(heads: int, length: int) -> str:
  return f"h{heads}_T{length}"


def _variants(d_model: int, heads_counts=HEADS, lengths=LENGTHS):
  for heads, length in [(h, t) for t in lengths for h in heads_counts]:
    yield name(heads, length), {"task_options": {"length": length},
                                "model": {"num_heads": heads, "head_dim": d_model}}


def _contrasts(lengths=LENGTHS):
  """Below D, the longest length against the shortest (the error rises with T); at each length,
  D - 1 heads against D (the step sits at D, not below it)."""
  for heads in range(1, D):
    yield name(heads, lengths[-1]), name(heads, lengths[0])
  for length in lengths:
    yield name(D - 1, length), name(D, length)


def get_config(mode=None):
  check_mode(mode)
  quick = "quick" if mode == "quick" else None
  heads_counts, lengths, steps, batch_size, seeds, num_test = (
      ACCELERATOR if mode == "accelerator" else
      (HEADS, LENGTHS, STEPS, BATCH_SIZE, NUM_SEEDS, NUM_TEST))
  d_model = multi_retrieval.get_config().model.d_model
  sweep = sweep_config(quick, steps=steps, eval_every=steps // 5, warmup=100,
                       base=multi_retrieval, variants=_variants(d_model, heads_counts, lengths),
                       baseline=name(1, lengths[0]), contrasts=_contrasts(lengths),
                       test="permutation", bracket=1, seeds=seeds,
                       learning_rates=LEARNING_RATES[1:] if quick else LEARNING_RATES,
                       predictions="configs/ablations/heads_length.py"
                       + (f":{mode}" if mode else ""))
  sweep.train.model.num_layers = 1
  sweep.train.batch_size = batch_size
  if not quick:
    sweep.train.task_options.num_test = num_test
  return sweep


MARGIN = 0.05  # NMSE: 5% of the target's variance unexplained counts as "near zero"


def predictions(mode=None) -> dict:
  """The predictions, fixed before the sweep ran (python -m experiments.findings): the measure
  is the test NMSE of each arm h<heads>_T<length> at its rate chosen on the validation stream,
  every comparison unpaired (the permutation test of the difference of means, as the sweep's
  report). From Yu et al. (2025, arXiv 2510.06662): one attention layer retrieving D maxima
  needs h >= D heads; below D, the parameters it needs grow with the sequence length T.

  - L1 (below D the error rises with T): for h = 1, 2, 3 the NMSE at the longest T is above
    that at the shortest.
  - L2 (from h = D it stays near zero): at every T, h = D = 4 has a mean NMSE below MARGIN, the
    upper end of its 95% interval included (an interval, not a test: 6 seeds cannot pass a sign
    test after Holm).
  - L3 (a step at D, not a decline in proportion to the heads missing): at every T, three heads
    leave an NMSE above that of four, and along h = 1, 2, 3, 4 at the longest T the largest
    fall of the mean NMSE is the last one, 3 -> 4.
  - L4 (which head retrieves which maximum): checked by the probe (scripts/heads_length_probe.py).

  Written after two timing trials of the arm h4_T64, run to size the sweep.
  """
  heads, lengths = (ACCELERATOR[:2] if mode == "accelerator" else (HEADS, LENGTHS))
  shortest, longest = lengths[0], lengths[-1]
  unpaired = {"paired": False}
  return {
      "setting": "arms",
      "figure": "nmse_by_heads_and_length",
      "measures": {"primary": {"column": "eval_nmse"}},
      "predictions": (
          ("L1", f"h < {D}, T {shortest} against {longest}",
           tuple(("above", name(h, longest), name(h, shortest), unpaired)
                 for h in heads if h < D)),
          ("L2", f"h = {D}", tuple(("below", name(D, t), MARGIN) for t in lengths)),
          ("L3", f"h = {D - 1} against {D}",
           tuple(("above", name(D - 1, t), name(D, t), unpaired) for t in lengths)
           + (("largest_drop", tuple(name(h, longest) for h in range(1, D + 1)), D - 2),)),
      )}
