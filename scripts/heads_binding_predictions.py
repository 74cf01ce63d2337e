"""Did the heads-binding predictions hold? Each prediction of docs/results/heads_binding.md as
checks on the two sweeps' results, every variant at the learning rate its report chose.

  python scripts/heads_binding_predictions.py \
      --multi_retrieval=docs/results/heads_binding/multi_retrieval/results.csv \
      --farthest_point=docs/results/heads_binding/farthest_point/results.csv \
      --out=docs/results/heads_binding/predictions.md
  python scripts/heads_binding_predictions.py \
      --accelerator=docs/results/heads_binding/multi_retrieval_accelerator/results.csv \
      --out=docs/results/heads_binding/predictions_accelerator.md

Comparisons are paired by seed (seed s of every variant saw the same batches in the same order):
the mean difference of test NMSE with its 95% bootstrap interval and the exact sign-flip test's
p, corrected by Holm over every tested check of the table. A prediction holds when all its checks
do. The checks, fixed before the sweeps ran (the first three from scripts/predictions.py):
- "a > b": a's NMSE is above b's, Holm-adjusted p < 0.05;
- "a not above b": not "a > b";
- "a ~ b": a within MARGIN (NMSE) of b, by two one-sided tests (Holm-adjusted p < 0.05);
- "a recovers half": a's mean NMSE is at most halfway from the worse arm's to the better's
  (untestable, so not holding, unless the worse arm is above the better at raw p < 0.05);
- "largest drop": the largest fall of mean NMSE along the head counts is at the given step.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations import heads_binding  # noqa: E402
from experiments import statistics, sweep_report  # noqa: E402
from scripts.predictions import (  # noqa: E402
    above, chosen, close, difference, largest_drop, mean_of, not_above, table)

def recovers_half(nmse, a, worse, better):
  """Whether ``a`` sits at most halfway from ``worse`` to ``better``; untestable (False) unless
  ``worse`` is significantly above ``better``."""
  gap = mean_of(nmse, worse) - mean_of(nmse, better)
  recovered = (mean_of(nmse, worse) - mean_of(nmse, a)) / gap if gap else math.nan
  name = f"{a} recovers half of {worse} -> {better}"
  gap_test = difference(nmse, worse, better)
  if not (gap_test.estimate > 0 and gap_test.p < statistics.SIGNIFICANT):
    return name, None, (f"no significant gap: {worse} - {better} = {gap_test.estimate:+.3g}, "
                        f"p {gap_test.p:.2g}, {gap_test.n} seeds")
  return (name, recovered >= 0.5,
          f"recovers {recovered:.0%} of a gap of {gap:.3f} NMSE ({a} {mean_of(nmse, a):.3f}, "
          f"{worse} {mean_of(nmse, worse):.3f}, {better} {mean_of(nmse, better):.3f})")


def short_of_half(nmse, a, worse, better):
  _, held, text = recovers_half(nmse, a, worse, better)
  return (f"{a} recovers less than half of {worse} -> {better}",
          None if held is None else not held, text)


def predictions(mr, fp) -> list[tuple[int, str, list]]:
  """(number, task, checks) per prediction; mr and fp: {variant: {seed: NMSE}}."""
  split = ["split_1", "split_2", "split_4", "split_8", "split_16"]
  fixed = ["split_1", "fixed_2", "fixed_4", "fixed_8", "fixed_16"]
  return [
      (1, "multi_retrieval", [above(mr, "split_1", "split_4"), above(mr, "split_2", "split_4"),
                              above(mr, "split_2", "split_8"), above(mr, "split_2", "split_16"),
                              largest_drop(mr, split, 1)]),
      (2, "multi_retrieval", [above(mr, "fixed_2", "fixed_4"), largest_drop(mr, fixed, 1)]),
      (3, "multi_retrieval", [close(mr, "split_8", "split_4"), close(mr, "split_16", "split_4")]),
      (4, "multi_retrieval", [above(mr, "talking_heads_2", "split_4"),
                              short_of_half(mr, "talking_heads_2", "split_2", "split_4")]),
      (5, "multi_retrieval", [recovers_half(mr, "layers2_2", "split_2", "split_4"),
                              not_above(mr, "split_2", "layers2_1")]),
      (6, "farthest_point", [above(fp, "split_16", "split_1"), above(fp, "split_4", "split_1")]),
      (7, "farthest_point", [not_above(fp, v, "split_1") for v in fixed[1:]]),
      (8, "farthest_point", [recovers_half(fp, "talking_heads_16", "split_16", "split_1"),
                             recovers_half(fp, "dcmha_16", "split_16", "split_1")]),
      (9, "farthest_point", [short_of_half(fp, "layers2_16", "split_16", "split_1")]),
  ]


ACCELERATOR_HEADS = heads_binding.ACCELERATOR["multi_retrieval"][2]  # the sweep's head counts


def accelerator_predictions(mr) -> list[tuple[str, str, list]]:
  """The predictions for configs/ablations/heads_binding.py:multi_retrieval_accelerator (D = 8
  maxima at d_model 64): the step moves to h = D = 8."""
  split = [f"split_{h}" for h in ACCELERATOR_HEADS]
  task = "multi_retrieval, D = 8"
  return [
      ("A1", task, [above(mr, f"split_{h}", "split_8") for h in (1, 2, 4)]
       + [largest_drop(mr, split, 2)]),
      ("A2", task, [above(mr, "fixed_2", "split_8"), above(mr, "fixed_4", "split_8")]),
      ("A3", task, [close(mr, "split_16", "split_8"), close(mr, "split_32", "split_8")]),
  ]


HEADS = (1, 2, 4, 8, 16)


# Words for the extra arms' names in the figure's legend.
ARM_WORDS = {"layers2": "2 layers", "talking_heads": "talking heads", "dcmha": "DCMHA"}


def plot(by_task: dict, path: str, heads=HEADS) -> None:
  """Test NMSE against the head count, a panel per task ({task: {variant: {seed: NMSE}}}): the
  standard split and the fixed head size (h = 1 is split_1 in both; the head counts the sweep
  ran), means with 95% bootstrap intervals, and each extra arm as a marker at its head count.
  Every series is nudged sideways and has its own marker, so that coinciding ones stay
  visible."""
  figure, axes = plt.subplots(1, len(by_task), figsize=(5.2 * len(by_task), 4.2), squeeze=False)
  for axis, (task, nmse) in zip(axes[0], by_task.items()):
    extra = sorted(set(nmse) - {f"{a}_{h}" for a in ("split", "fixed") for h in heads})
    series = [(arm, "-o" if arm == "split" else "--s") for arm in ("split", "fixed")]
    count_series = len(series) + len(extra)
    for index, (arm, style) in enumerate(series):
      counts = [1] + [h for h in heads[1:] if f"{arm}_{h}" in nmse]
      names = ["split_1"] + [f"{arm}_{h}" for h in counts[1:]]
      cells = [statistics.mean_interval(list(nmse[n].values()), 0.0) for n in names]
      means = np.array([c[0] for c in cells])
      errors = np.array([[c[0] - c[1] for c in cells], [c[2] - c[0] for c in cells]])
      label = "dₖ = d_model / h" if arm == "split" else "dₖ = d_model"
      nudge = 1.05 ** (index - (count_series - 1) / 2)
      axis.errorbar(np.array(counts) * nudge, means, yerr=errors, fmt=style, capsize=3,
                    label=label, markersize=5, alpha=0.9)
    for index, name in enumerate(extra, start=len(series)):
      arm, count = name.rsplit("_", 1)
      mean, low, high = statistics.mean_interval(list(nmse[name].values()), 0.0)
      nudge = 1.05 ** (index - (count_series - 1) / 2)
      axis.errorbar([int(count) * nudge], [mean], yerr=[[mean - low], [high - mean]],
                    fmt="^v<>DP"[(index - len(series)) % 6], capsize=3, markersize=6,
                    label=f"{ARM_WORDS.get(arm, arm)}, h = {count}")
    axis.set_xscale("log", base=2)
    axis.set_xticks(heads, [str(h) for h in heads])
    axis.set_xlabel("heads h (model width fixed)")
    axis.set_ylabel("test NMSE (mean, 95% bootstrap interval)")
    axis.set_title(task.replace("_", " "))
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2,
                frameon=False)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--multi_retrieval", help="results.csv of that sweep")
  parser.add_argument("--farthest_point", help="results.csv of that sweep")
  parser.add_argument("--accelerator", help="results.csv of the multi_retrieval_accelerator "
                      "sweep (checked alone)")
  parser.add_argument("--out", default=None, help="write the table here (markdown)")
  parser.add_argument("--plot", default=None, help="draw NMSE against the head count here (png)")
  args = parser.parse_args()
  if args.accelerator:
    mr = chosen(sweep_report.records_from_csv(args.accelerator))
    text, by_task, heads = table(accelerator_predictions(mr)), {"multi_retrieval, D = 8": mr}, \
        ACCELERATOR_HEADS
  elif args.multi_retrieval and args.farthest_point:
    mr, fp = (chosen(sweep_report.records_from_csv(path))
              for path in (args.multi_retrieval, args.farthest_point))
    text, by_task, heads = table(predictions(mr, fp)), {
        "multi_retrieval": mr, "farthest_point": fp}, HEADS
  else:
    parser.error("give --accelerator, or both --multi_retrieval and --farthest_point")
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  if args.plot:
    plot(by_task, args.plot, heads)
  print(text)


if __name__ == "__main__":
  main()
