"""Scaling, tuned: is the unscaled model's trouble saturation at initialisation or the way it
trains? On a task the paper's 1/sqrt(d_k) solves, at d_k 16 and 64, with bracketed rates.

  python -m experiments.sweep --config=configs/ablations/scaling_init.py \
      --workdir=workdir/ablations/scaling_init
  python -m experiments.sweep --config=configs/ablations/scaling_init.py:quick --workdir=/tmp/si
  python -m experiments.sweep --config=configs/ablations/scaling_init.py:accelerator \
      --workdir=workdir/ablations/scaling_init_accelerator

configs/ablations/scaling.py left this open: there the paper's arm reached 0.58-0.98 accuracy
(one head per layer, 600 steps) and the unscaled arm's best rate was the grid's lowest, so
neither "solves" nor "tuned" held. Here the model is configs/mqar.py's (2 layers, 4 heads per
layer, RoPE), where 1/sqrt(d_k) solved MQAR in trial runs (10 seeds at 1e-3: every seed >= 0.94
at d_k 16 and >= 0.975 at d_k 64 after 1000 steps); d_k is set by model.head_dim, the residual
stream stays at 64. Four arms per d_k:

- ``inv_sqrt``: logits q.k / sqrt(d_k), the paper's (each group's baseline);
- ``none``: q.k, unscaled;
- ``none_init``: q.k, unscaled, with W_Q initialised x d_k^-1/2: at step 0 its logits are
  exactly inv_sqrt's. With Adam (updates of about the learning rate per entry, whatever the
  gradient's scale) it is inv_sqrt with W_Q's learning rate x sqrt(d_k); ``none`` is
  inv_sqrt with W_Q's initial values *and* learning rate x sqrt(d_k). So none against none_init
  measures the initial saturation; none_init against inv_sqrt the faster query updates;
- ``qk_norm_inv``: LayerNorm on each head's queries and keys and a 1/d_k scale, so that
  |logit| <= g_q g_k (the LayerNorms' gains) at any d_k: a bound that does not grow with d_k.

Measure: the step at which a seed first reaches 0.9 test accuracy (time_to_solve; a seed that
never does counted one evaluation past the end), each arm at its learning rate chosen on a
validation stream, paired by seed. The grid 3e-4, 1e-3, 3e-3 is extended by up to two rates past
an edge where a choice sits on it (the unscaled arms are expected to want lower rates). 10 seeds:
the exact paired test's smallest p is 2/1024, which survives Holm over the 6 comparisons.
Predictions, committed before the run: ``predictions`` below (python -m experiments.findings).
Results, runtime and provenance: docs/results/scaling_init.md.

`:accelerator` is the study sized for one GPU or TPU: d_k 64, 256 and 1024, 2000 steps, the same
arms, seeds and rates.
"""

from configs import mqar
from configs.ablations import check_mode, sweep_config

HEAD_DIMS = (16, 64)
ARMS = ("inv_sqrt", "none", "none_init", "qk_norm_inv")
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
STEPS, EVAL_EVERY = 1200, 100
NUM_SEEDS = 10
ACCELERATOR_HEAD_DIMS, ACCELERATOR_STEPS = (64, 256, 1024), 2000


def model_overrides(arm: str, head_dim: int) -> dict:
  """The model settings of ``arm`` at d_k = ``head_dim``."""
  return {"inv_sqrt": {}, "none": {"attention_scale": "none"},
          "none_init": {"attention_scale": "none", "query_init_scale": head_dim ** -0.5},
          "qk_norm_inv": {"normalize_qk": True, "attention_scale": "inv"}}[arm]


def name(arm: str, head_dim: int) -> str:
  return f"dk{head_dim}_{arm}"


def get_config(mode=None):
  check_mode(mode)
  head_dims = ACCELERATOR_HEAD_DIMS if mode == "accelerator" else HEAD_DIMS
  steps = ACCELERATOR_STEPS if mode == "accelerator" else STEPS
  return sweep_config(
      "quick" if mode == "quick" else None, steps=steps, eval_every=EVAL_EVERY, warmup=60,
      base=mqar, baseline=name("inv_sqrt", head_dims[0]), test="time_to_solve",
      contrasts=((name(arm, d), name("inv_sqrt", d)) for d in head_dims for arm in ARMS[1:]),
      variants=((name(arm, d), {"model": {"head_dim": d, **model_overrides(arm, d)}})
                for d in head_dims for arm in ARMS),
      seeds=NUM_SEEDS, learning_rates=LEARNING_RATES[1:] if mode == "quick" else LEARNING_RATES,
      predictions="configs/ablations/scaling_init.py" + (f":{mode}" if mode else ""))


SOLVED = 0.95  # the accuracy 1/sqrt(d_k) must reach in every seed (the design)


def predictions(mode=None) -> dict:
  """The predictions, fixed before the sweep ran (python -m experiments.findings): the measure
  is the steps a seed takes to reach 0.9 test accuracy (a seed that never does counted at the
  horizon, one evaluation past the end), each arm at its rate chosen on the validation stream,
  paired by seed; "above" means more steps.

  - D (the design, not a prediction): at every d_k the paper's 1/sqrt(d_k) reaches at least
    0.95 test accuracy in every seed at its chosen rate, and every arm's chosen rate lies inside
    the rates it tried (the grid, extended past an edge where the choice sat on it).
  - T1 (Vaswani et al. 2017, footnote 4): without the 1/sqrt(d_k) the logits' variance grows
    with d_k and the softmax saturates: at the largest d_k ``none`` takes more steps than
    ``inv_sqrt``.
  - T2: that penalty grows with d_k: none - inv_sqrt at the largest d_k above the same at the
    smallest.
  - T3 (part of it is the saturation at initialisation): at the largest d_k ``none`` takes more
    steps than ``none_init``, which starts from inv_sqrt's logits.
  - T4 (part of it is the dynamics: none_init is inv_sqrt with W_Q's learning rate x sqrt(d_k)
    under Adam): at the largest d_k ``none_init`` takes more steps than ``inv_sqrt``.
  - T5 (a bound that does not grow with d_k has to be learned: with QK-norm and 1/d_k a logit is
    at most the product of the LayerNorms' gains, 1 at initialisation, too flat for a sharp
    lookup among 8 tokens until the gains grow): ``qk_norm_inv`` takes more steps than
    ``inv_sqrt`` at the smallest and the largest d_k.

  Written after trial runs of inv_sqrt alone and before any run of the other arms.
  """
  head_dims = ACCELERATOR_HEAD_DIMS if mode == "accelerator" else HEAD_DIMS
  steps = ACCELERATOR_STEPS if mode == "accelerator" else STEPS
  small, large = head_dims[0], head_dims[-1]
  gap = {d: f"gap_{d}" for d in (small, large)}
  return {
      "setting": "arms",
      "measures": {
          "primary": {"column": "steps_to_threshold", "read": "steps",
                      "censored_at": steps + EVAL_EVERY,
                      "differences": {gap[d]: (name("none", d), name("inv_sqrt", d))
                                      for d in (small, large)}},
          "accuracy": {"column": "eval_accuracy"}},
      "predictions": (
          ("D", "design", tuple(("reaches", name("inv_sqrt", d), SOLVED, {"measure": "accuracy"})
                                for d in head_dims) + (("rates_inside",),)),
          ("T1", f"d_k {large}", (("above", name("none", large), name("inv_sqrt", large)),)),
          ("T2", f"d_k {large} against {small}", (("above", gap[large], gap[small]),)),
          ("T3", f"d_k {large}", (("above", name("none", large), name("none_init", large)),)),
          ("T4", f"d_k {large}", (("above", name("none_init", large), name("inv_sqrt", large)),)),
          ("T5", f"d_k {small} and {large}",
           tuple(("above", name("qk_norm_inv", d), name("inv_sqrt", d)) for d in (small, large))),
      )}
