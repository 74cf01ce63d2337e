"""Did the predictions of the tuned scaling study hold? The sweep configs/ablations/scaling_init.py,
its predictions fixed before it ran, as checks on its results.

  python scripts/scaling_init_predictions.py \
      --results=docs/results/scaling_init/results.csv \
      --out=docs/results/scaling_init/predictions.md

The measure is the number of steps a seed takes to reach 0.9 test accuracy (a seed that never
does counted at the horizon, one evaluation past the end), each arm dk<d_k>_<arm> at its learning
rate chosen on the validation stream, paired by seed; Holm over the table's tested checks
(scripts/predictions.py: "a > b" means a takes more steps, p < 0.05 after Holm).

- D (the design, not a prediction): at every d_k the paper's 1/sqrt(d_k) reaches at least 0.95
  test accuracy in every seed at its chosen rate, and every arm's chosen rate lies inside the
  rates it tried (the grid, extended past an edge where the choice sat on it).
- T1 (Vaswani et al. 2017, footnote 4): without the 1/sqrt(d_k) the logits' variance grows with
  d_k and the softmax saturates: at d_k 64 ``none`` takes more steps than ``inv_sqrt``.
- T2: that penalty grows with d_k: none - inv_sqrt at d_k 64 above the same at d_k 16.
- T3 (part of it is the saturation at initialisation): at d_k 64 ``none`` takes more steps than
  ``none_init``, which starts from inv_sqrt's logits.
- T4 (part of it is the dynamics: none_init is inv_sqrt with W_Q's learning rate x sqrt(d_k)
  under Adam): at d_k 64 ``none_init`` takes more steps than ``inv_sqrt``.
- T5 (a bound that does not grow with d_k has to be learned: with QK-norm and 1/d_k a logit is
  at most the product of the LayerNorms' gains, 1 at initialisation, too flat for a sharp
  lookup among 8 tokens until the gains grow): ``qk_norm_inv`` takes more steps than
  ``inv_sqrt`` at d_k 16 and at d_k 64.

Written after trial runs of inv_sqrt alone (the config's docstring) and before any run of the
other arms.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import scaling_init  # noqa: E402
from configs.ablations.scaling_init import name  # noqa: E402
from experiments import statistics, sweep_report, verdicts  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from scripts.predictions import above, chosen  # noqa: E402

SOLVED = 0.95  # the accuracy 1/sqrt(d_k) must reach in every seed (the design)


def steps_to_solve(records) -> dict[str, dict[int, float]]:
  """{arm: {seed: steps to 0.9 test accuracy}} at the chosen rates; a seed that never reaches
  it at the horizon, one evaluation past the last step (of the CPU sweep, or of the accelerator
  preset where the records hold its d_k)."""
  accelerator = any(_order(r["variant"])[0] not in scaling_init.HEAD_DIMS for r in records)
  steps = scaling_init.ACCELERATOR_STEPS if accelerator else scaling_init.STEPS
  horizon = steps + scaling_init.EVAL_EVERY
  return chosen(records, verdicts.STEPS_TO,
                lambda step: float(statistics.restricted_times([step], horizon)[0]))


def design(records) -> list[tuple[str, bool, str]]:
  """The design's untested checks: inv_sqrt solves in every seed, every choice inside the grid."""
  choices = verdicts.choose(records, sweep_report.measure_of(records))
  accuracy = {c.variant: c.metrics["eval_accuracy"] for c in choices}
  checks = [(f"{arm} >= {SOLVED:g} in every seed", min(accuracy[arm]) >= SOLVED,
             f"lowest {min(accuracy[arm]):.4g} of {len(accuracy[arm])} seeds")
            for arm in sorted(accuracy, key=_order) if arm.endswith("_inv_sqrt")]
  edges = [f"{c.variant} at {c.learning_rate:g}" for c in choices if c.edge]
  checks.append(("every chosen rate inside the rates tried", not edges,
                 "; ".join(edges) or f"all {len(choices)} arms"))
  return checks


def _order(arm: str) -> tuple[int, str]:
  return int(arm[2:].split("_")[0]), arm


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, the arms compared, checks) per prediction, at the chosen learning rates."""
  return [("D", "design", design(records))] + predictions_of(steps_to_solve(records))


def predictions_of(steps) -> list[tuple[str, str, list]]:
  """The checks on {arm: {seed: steps to solve}}."""
  head_dims = sorted({_order(arm)[0] for arm in steps})
  small, large = head_dims[0], head_dims[-1]
  penalty = {f"gap_{d}": {s: steps[name("none", d)][s] - steps[name("inv_sqrt", d)][s]
                          for s in steps[name("inv_sqrt", d)]} for d in (small, large)}
  return [
      ("T1", f"d_k {large}", [above(steps, name("none", large), name("inv_sqrt", large))]),
      ("T2", f"d_k {large} against {small}", [above(penalty, f"gap_{large}", f"gap_{small}")]),
      ("T3", f"d_k {large}", [above(steps, name("none", large), name("none_init", large))]),
      ("T4", f"d_k {large}", [above(steps, name("none_init", large), name("inv_sqrt", large))]),
      ("T5", f"d_k {small} and {large}", [above(steps, name("qk_norm_inv", d),
                                                name("inv_sqrt", d)) for d in (small, large)]),
  ]


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "arms")
