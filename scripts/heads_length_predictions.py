"""Did the predictions of the heads-and-length study hold? The sweep
configs/ablations/heads_length.py, its predictions fixed before it ran, as checks on its results.

  python scripts/heads_length_predictions.py \
      --results=docs/results/heads_length/results.csv \
      --out=docs/results/heads_length/predictions.md

With --out, also nmse_by_heads.png beside it: test NMSE against h, a line per length, and the
proportional decline NMSE(1) (D - h) / (D - 1) of each length dotted.

The measure is the test NMSE of each arm h<heads>_T<length> at its learning rate chosen on the
validation stream; every comparison unpaired (the permutation test of the difference of means,
as the sweep's own report), Holm over the table's tested checks (scripts/predictions.py). From Yu et al. (2025, arXiv 2510.06662): one
attention layer retrieving D maxima needs h >= D heads; below D, the parameters it needs grow
with the sequence length T.

- L1 (below D the error rises with T): for h = 1, 2, 3 the NMSE at T = 64 is above that at
  T = 8.
- L2 (from h = D it stays near zero): at every T, h = D = 4 has a mean NMSE below MARGIN (0.05:
  5% of the target's variance unexplained), the upper end of its 95% bootstrap interval
  included (an interval, not a test: 6 seeds cannot pass a sign test after Holm).
- L3 (a step at D, not a decline in proportion to the heads missing): at every T, three heads
  leave an NMSE above that of four, and along h = 1, 2, 3, 4 at T = 64 the largest fall of the
  mean NMSE is the last one, 3 -> 4. A proportional decline (each missing head costing the
  same) would make the falls equal and put NMSE(3) near NMSE(1) / 3; the table shows both.
- L4 (which head retrieves which maximum): checked by scripts/heads_length_probe.py.

Written after two timing trials of the arm h4_T64 (100 steps at 10 seeds, then 500-600 steps at
6 seeds and batch 32), run to size the sweep; what they showed is on the results page.
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations.heads_length import D, name  # noqa: E402
from scripts import predictions as predictions_lib  # noqa: E402
from experiments import statistics  # noqa: E402
from scripts.predictions import MARGIN, above, chosen, largest_drop  # noqa: E402



def grid(nmse) -> tuple[list[int], list[int]]:
  """The head counts and the lengths the sweep ran, from its arms' names h<heads>_T<length>."""
  arms = [tuple(map(int, arm[1:].split("_T"))) for arm in nmse]
  return sorted({h for h, _ in arms}), sorted({t for _, t in arms})


def near_zero(nmse, arm):
  """An untested check: ``arm``'s mean NMSE below MARGIN, its interval's upper end included."""
  mean, low, high = statistics.mean_interval(list(nmse[arm].values()), 0.0)
  return (f"{arm} below {MARGIN:g}", high < MARGIN,
          f"{arm} {mean:.3g} [{low:.3g}, {high:.3g}], {len(nmse[arm])} seeds")


def predictions(records) -> list[tuple[str, str, list]]:
  """(name, the arms compared, checks) per prediction, at the chosen learning rates."""
  return predictions_of(chosen(records))


def predictions_of(nmse) -> list[tuple[str, str, list]]:
  """The checks on {arm: {seed: test NMSE}}."""
  heads, lengths = grid(nmse)
  shortest, longest = lengths[0], lengths[-1]
  below_d = [h for h in heads if h < D]
  return [
      ("L1", f"h < {D}, T {shortest} against {longest}",
       [above(nmse, name(h, longest), name(h, shortest), paired=False) for h in below_d]),
      ("L2", f"h = {D}", [near_zero(nmse, name(D, t)) for t in lengths]),
      ("L3", f"h = {D - 1} against {D}",
       [above(nmse, name(D - 1, t), name(D, t), paired=False) for t in lengths]
       + [largest_drop(nmse, [name(h, longest) for h in range(1, D + 1)], D - 2)]),
  ]


def plot(nmse, path: str) -> None:
  """Test NMSE against the head count, a line per length (means, 95% bootstrap intervals)."""
  heads, lengths = grid(nmse)
  figure, axis = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
  for k, length in enumerate(lengths):
    cells = [statistics.mean_interval(list(nmse[name(h, length)].values()), 0.0)
             for h in heads]
    means = [c[0] for c in cells]
    errors = [[c[0] - c[1] for c in cells], [c[2] - c[0] for c in cells]]
    color = f"C{k}"
    axis.errorbar([h + 0.05 * (k - 1) for h in heads], means, yerr=errors, color=color,
                  marker="o", capsize=3, label=f"T = {length}")
    below = [h for h in heads if h <= D]
    axis.plot(below, [means[0] * (D - h) / (D - 1) for h in below], color=color,
              linestyle=":", linewidth=1)
  axis.set_xticks(heads)
  axis.set_xlabel(f"heads h (each of d_k 32); D = {D} maxima")
  axis.set_ylabel("test NMSE")
  axis.plot([], [], color="gray", linestyle=":", label="NMSE(1) (D - h) / (D - 1)")
  axis.legend(fontsize=8)
  figure.savefig(path, dpi=110)
  plt.close(figure)


def figure(records, directory: str) -> None:
  plot(chosen(records), os.path.join(directory, "nmse_by_heads.png"))


if __name__ == "__main__":
  predictions_lib.main(__doc__, predictions, "arms", figure)
