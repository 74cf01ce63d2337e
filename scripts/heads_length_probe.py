"""Which head retrieves which maximum? The trained models of configs/ablations/heads_length.py,
probed on held-out examples.

  python scripts/heads_length_probe.py --sweep=workdir/ablations/heads_length \
      --out=docs/results/heads_length

For each arm with h >= D - 1 heads, at its learning rate chosen on the validation stream, and each
seed: on the first NUM_EXAMPLES examples of the test set, the token each head's read-out query
(the CLS token) attends to most, against the token that attains each maximum,
argmax_s <w_i, x_s>. share[j, i] is the fraction of examples on which they coincide. The D
maxima are matched to distinct heads by the assignment that maximises the summed share
(scipy.optimize.linear_sum_assignment); a maximum is "retrieved" when its head's share is at least
RETRIEVED. Writes probe.md (per arm: the matched share of each maximum, means with 95% intervals
over seeds, and the seeds in which every maximum is retrieved) and probe.png (share[j, i] of seed
0 for h = D at each length).

Prediction (L4, fixed with the sweep's before it ran): at h = D every maximum has its own head,
at every length: each maximum's matched share has a mean of at least RETRIEVED over the seeds,
the lower end of its 95% bootstrap interval included (an interval, not a test: 6 seeds cannot
pass a sign test after Holm over the lengths).
"""

from __future__ import annotations

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import optimize  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations.heads_length import D, LENGTHS, name  # noqa: E402
from experiments import probes, statistics, sweep_report, trained, verdicts  # noqa: E402
from experiments import workdir as workdir_lib  # noqa: E402
from experiments.tasks import multi_retrieval  # noqa: E402

NUM_EXAMPLES = 500
RETRIEVED = 0.8


def shares(run) -> np.ndarray:
  """share[j, i]: how often head j's most-attended token is the argmax of maximum i, [N, D]."""
  x = np.asarray(run.task.test.tokens[:NUM_EXAMPLES])  # [B, T, F]
  _, weights, _ = probes.capture(run.model, run.params, x)
  read_out = np.asarray(weights[0])[:, :, 0, 1:]  # the CLS query over the T vectors: [B, N, T]
  attended = read_out.argmax(-1)  # [B, N]
  options = run.config.task_options
  w, _, _ = multi_retrieval.function(options.get("directions_seed", 0), options.num_retrievals,
                                     options.length, options.features)
  argmax = np.einsum("btf,df->btd", x, w).argmax(1)  # [B, D]
  return (attended[:, :, None] == argmax[:, None, :]).mean(0)  # [N, D]


def matched(share: np.ndarray) -> np.ndarray:
  """Each maximum's share under the assignment of distinct heads that maximises their sum: [D]
  (0 for a maximum left without a head when there are fewer heads than maxima)."""
  heads, maxima = optimize.linear_sum_assignment(share, maximize=True)
  out = np.zeros(share.shape[1])
  out[maxima] = share[heads, maxima]
  return out


def probe(sweep: str) -> dict[str, list[np.ndarray]]:
  """{arm: [share per seed]} for every arm with at least D - 1 heads."""
  records = sweep_report.records_from_csv(os.path.join(sweep, "results.csv"))
  chosen = verdicts.choose(records, sweep_report.measure_of(records))
  return {c.variant: [shares(run) for run in trained.at_rate(
              os.path.join(sweep, "variants", c.variant), c.learning_rate)]
          for c in chosen
          if workdir_lib.flatten(c.record["overrides"])["model.num_heads"] >= D - 1}


def _cell(values) -> str:
  mean, low, high = statistics.mean_interval(values, 0.0, 1.0)
  return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def table(results: dict[str, list[np.ndarray]]) -> str:
  """Per arm: each maximum's matched share over the seeds, and the seeds in which every maximum
  is retrieved."""
  lines = ["| arm | " + " | ".join(f"max {i + 1}" for i in range(D))
           + f" | seeds with every maximum retrieved (>= {RETRIEVED:g}) |",
           "|---|" + "---|" * D + "---|"]
  for arm, per_seed in results.items():
    best = np.array([matched(s) for s in per_seed])  # [seeds, D]
    every = int(np.sum(np.all(best >= RETRIEVED, axis=1)))
    lines.append(f"| {arm} | " + " | ".join(_cell(best[:, i]) for i in range(D))
                 + f" | {every} of {len(best)} |")
  return "\n".join(lines) + "\n"


def l4(results: dict[str, list[np.ndarray]]) -> tuple[bool, str]:
  """L4: at h = D, at every length, each maximum's matched share at least RETRIEVED, the lower
  end of its interval included; (held, the lowest lower end and where)."""
  lows = {(arm, i): statistics.mean_interval([matched(s)[i] for s in results[arm]], 0.0, 1.0)[1]
          for arm in (name(D, t) for t in LENGTHS) for i in range(D)}
  (arm, i), low = min(lows.items(), key=lambda item: item[1])
  return low >= RETRIEVED, f"lowest interval end {low:.2f} (maximum {i + 1} of {arm})"


def plot(results: dict[str, list[np.ndarray]], path: str) -> None:
  arms = [name(D, t) for t in LENGTHS if name(D, t) in results]
  figure, axes = plt.subplots(1, len(arms), figsize=(3.0 * len(arms) + 1.0, 3.0),
                              squeeze=False, sharey=True, layout="constrained")
  for k, (axis, arm) in enumerate(zip(axes[0], arms)):
    image = axis.imshow(results[arm][0], vmin=0, vmax=1, cmap="viridis")
    axis.set_title(f"{D} heads, T = {arm.split('_T')[1]} (seed 0)", fontsize=9)
    axis.set_xlabel("maximum i")
    axis.set_xticks(range(D), [str(i + 1) for i in range(D)])
    axis.set_yticks(range(D), [str(j + 1) for j in range(D)])
    if k == 0:
      axis.set_ylabel("head j")
  figure.colorbar(image, ax=axes[0].tolist(), shrink=0.9,
                  label="share: head j's top token\nis the argmax of maximum i")
  figure.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(figure)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="the sweep's workdir (results.csv, variants/)")
  parser.add_argument("--out", default=None, help="output directory (default: the sweep's)")
  args = parser.parse_args()
  results = probe(args.sweep)
  out = args.out or args.sweep
  os.makedirs(out, exist_ok=True)
  held, measured = l4(results)
  text = (f"Matched share of each maximum (mean over seeds, 95% bootstrap interval), on "
          f"{NUM_EXAMPLES} test examples, each arm at its chosen learning rate.\n\n"
          f"{table(results)}\nL4 (every maximum its own head at h = {D}, every length): "
          f"**{'held' if held else 'not held'}**, {measured}.\n")
  with open(os.path.join(out, "probe.md"), "w") as f:
    f.write(text)
  plot(results, os.path.join(out, "probe.png"))
  print(text)


if __name__ == "__main__":
  main()
