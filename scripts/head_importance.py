"""Which heads carry a trained sweep's answer: head importance (Michel et al. 2019) per variant.

  python scripts/head_importance.py --sweep=workdir/ablations/heads_binding/multi_retrieval \
      --out=docs/results/heads_binding/importance

For every variant of the sweep (or those given with --variants), every seed at the variant's
chosen learning rate (the one the sweep's report chose on its validation stream) is restored
and each head of each layer is switched off in turn (experiments/probes.py): its importance is
the NMSE it adds on the test set (or the accuracy it costs). A head is "essential" when its
importance is at least --threshold. Writes importance.md (per variant: the essential heads and
the share of the importance held by the top --top heads, with 95% intervals over the seeds) and
importance.png (each variant's importances in decreasing order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probes, statistics, sweep_report, trained, verdicts  # noqa: E402


def essential_heads(importance, threshold: float) -> int:
  """How many heads (over all layers) cost at least ``threshold`` when switched off alone."""
  return int(np.sum(np.asarray(importance) >= threshold))


def top_share(importance, top: int) -> float:
  """The share of the total positive importance held by the ``top`` most important heads."""
  positive = np.sort(np.clip(np.asarray(importance).ravel(), 0.0, None))[::-1]
  total = positive.sum()
  return float(positive[:top].sum() / total) if total > 0 else float("nan")


def chosen_rates(records) -> dict[str, float]:
  """{variant: learning rate} as the sweep's report chose them."""
  return {c.variant: c.learning_rate
          for c in verdicts.choose(records, sweep_report.measure_of(records))}


def variant_importances(variant_dir: str, learning_rate: float) -> list[np.ndarray]:
  """[L, N] importance of every seed trained at ``learning_rate`` in one variant's workdir."""
  return [probes.head_importance(run.model, run.params, run.task.test, run.config,
                                 run.task.num_classes)
          for run in trained.at_rate(variant_dir, learning_rate)]


def _cell(values, lower=-np.inf, upper=np.inf) -> str:
  mean, low, high = statistics.mean_interval(values, lower, upper)
  return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def table(results: dict, threshold: float, top: int) -> str:
  """results: {variant: [importance [L, N] per seed]} -> a markdown table."""
  lines = [f"| variant | heads | seeds | essential heads (>= {threshold:g}) | "
           f"share of the top {top} | largest importance |", "|---|---|---|---|---|---|"]
  for variant, importances in results.items():
    essential = [essential_heads(i, threshold) for i in importances]
    shares = [top_share(i, top) for i in importances]
    largest = [float(np.max(i)) for i in importances]
    lines.append(f"| {variant} | {importances[0].size} | {len(importances)} | "
                 f"{_cell(essential, 0, importances[0].size)} | {_cell(shares, 0, 1)} | "
                 f"{_cell(largest)} |")
  return "\n".join(lines) + "\n"


def plot(results: dict, path: str, measure: str) -> None:
  """Each variant's importances in decreasing order, the mean over seeds with its interval."""
  figure, axis = plt.subplots(figsize=(6.4, 3.6))
  for variant, importances in results.items():
    ranked = np.sort(np.stack([i.ravel() for i in importances]), axis=1)[:, ::-1]  # [seeds, L N]
    cells = np.array([statistics.mean_interval(ranked[:, k]) for k in range(ranked.shape[1])])
    means = cells[:, 0]
    errors = np.stack([means - cells[:, 1], cells[:, 2] - means])  # one seed: no interval
    axis.errorbar(np.arange(1, ranked.shape[1] + 1), means, yerr=errors, marker="o",
                  markersize=3, capsize=2, label=variant)
  axis.set_xscale("log", base=2)
  ranks = [2 ** k for k in range(max(len(i[0].ravel()) for i in results.values()).bit_length())]
  axis.set_xticks(ranks, [str(rank) for rank in ranks])
  axis.set_xlabel("head, by importance (1 = the most important)")
  axis.set_ylabel(f"{measure} when switched off")
  axis.axhline(0.0, color="gray", linewidth=0.5)
  axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="a sweep's workdir (results.csv, variants/)")
  parser.add_argument("--variants", default=None,
                      help="comma-separated variants (default: every variant with > 1 head)")
  parser.add_argument("--threshold", type=float, default=0.05,
                      help="importance at which a head counts as essential (NMSE or accuracy)")
  parser.add_argument("--top", type=int, default=None,
                      help="the share of the top this many heads (default: the task's "
                           "num_retrievals, else 1)")
  parser.add_argument("--out", default=None, help="output directory (default: the sweep's)")
  args = parser.parse_args()
  records = sweep_report.records_from_csv(os.path.join(args.sweep, "results.csv"))
  rates = chosen_rates(records)
  root = os.path.join(args.sweep, "variants")
  names = args.variants.split(",") if args.variants else sorted(rates)
  results = {}
  for name in names:
    if name not in rates:
      raise SystemExit(f"error: variant {name!r} has no result in {args.sweep}/results.csv; "
                       f"choose from {sorted(rates)}.")
    importances = variant_importances(os.path.join(root, name), rates[name])
    if args.variants or importances[0].size > 1:
      results[name] = importances
  with open(os.path.join(root, names[0], "config.json")) as f:
    top = args.top or json.load(f)["task_options"].get("num_retrievals", 1)
  measure = {"nmse": "NMSE added", "accuracy": "accuracy lost"}[sweep_report.measure_of(records)]
  out = args.out or args.sweep
  os.makedirs(out, exist_ok=True)
  text = (f"Head importance in {args.sweep} ({measure} when one head is switched off, on the "
          f"test set), at each variant's chosen learning rate; means with 95% intervals over "
          f"the seeds.\n\n" + table(results, args.threshold, top))
  with open(os.path.join(out, "importance.md"), "w") as f:
    f.write(text)
  plot(results, os.path.join(out, "importance.png"), measure)
  print(text)


if __name__ == "__main__":
  main()
