"""The figures a study's predictions page shows beside its table (python -m
experiments.findings --out=... draws the one its declaration names, ``figure``), each from the
records at the chosen learning rates: means with 95% intervals of every arm's seeds.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import figures, measures, report_plots, verdicts  # noqa: E402

HEADS = (1, 2, 4, 8, 16)  # heads_binding's head counts on the CPU
# Words for the extra arms' names in the legend of nmse_by_heads.
ARM_WORDS = {"layers2": "2 layers", "talking_heads": "talking heads", "dcmha": "DCMHA"}


def _nmse(records) -> dict[str, dict[int, float]]:
  return measures.Measure("eval_nmse").of(records)


def heads_binding(by_task: dict, path: str, heads=HEADS) -> None:
  """Test NMSE against the head count, a panel per task ({task: {variant: {seed: NMSE}}}): the
  standard split and the fixed head size (h = 1 is split_1 in both; the head counts the sweep
  ran), and each extra arm as a marker at its head count. Every series is nudged sideways and
  has its own marker, so that coinciding ones stay visible."""
  width = min(figures.WIDTH, 4.2 * len(by_task))
  figure, axes = plt.subplots(1, len(by_task), figsize=(width, 4.2),
                              squeeze=False)
  for axis, (task, nmse) in zip(axes[0], by_task.items()):
    extra = sorted(set(nmse) - {f"{a}_{h}" for a in ("split", "fixed") for h in heads})
    series = [(arm, "-o" if arm == "split" else "--s") for arm in ("split", "fixed")]
    count_series = len(series) + len(extra)
    for index, (arm, style) in enumerate(series):
      counts = [1] + [h for h in heads[1:] if f"{arm}_{h}" in nmse]
      names = ["split_1"] + [f"{arm}_{h}" for h in counts[1:]]
      means, errors = report_plots.yerr([list(nmse[n].values()) for n in names], "eval_nmse")
      label = "dₖ = d_model / h" if arm == "split" else "dₖ = d_model"
      nudge = 1.05 ** (index - (count_series - 1) / 2)
      axis.errorbar(np.array(counts) * nudge, means, yerr=errors, fmt=style, capsize=3,
                    label=label, markersize=5, alpha=0.9)
    for index, name in enumerate(extra, start=len(series)):
      arm, count = name.rsplit("_", 1)
      mean, errors = report_plots.yerr([list(nmse[name].values())], "eval_nmse")
      nudge = 1.05 ** (index - (count_series - 1) / 2)
      axis.errorbar([int(count) * nudge], mean, yerr=errors,
                    fmt="^v<>DP"[(index - len(series)) % 6], capsize=3, markersize=6,
                    label=f"{ARM_WORDS.get(arm, arm)}, h = {count}")
    axis.set_xscale("log", base=2)
    axis.set_xticks(heads, [str(h) for h in heads])
    axis.set_xlabel("heads h (model width fixed)")
    axis.set_ylabel("test NMSE (mean, 95% interval)")
    axis.set_title(task.replace("_", " "))
    axis.legend(fontsize=figures.SMALLEST, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                ncol=2, frameon=False)
  figure.tight_layout()
  figures.save(figure, path, dpi=110)


def nmse_by_heads(declaration, records, directory: str) -> None:
  """heads_binding's CPU study: nmse_by_heads.png, a panel per task."""
  heads_binding({task: _nmse(records[task]) for task in records},
                os.path.join(directory, "nmse_by_heads.png"))


def nmse_by_heads_accelerator(declaration, records, directory: str) -> None:
  """heads_binding's accelerator study (D = 8): nmse_by_heads_accelerator.png."""
  from configs.ablations.heads_binding import ACCELERATOR
  heads_binding({"multi_retrieval, D = 8": _nmse(records[measures.RESULTS])},
                os.path.join(directory, "nmse_by_heads_accelerator.png"),
                ACCELERATOR["multi_retrieval"][2])


def nmse_by_heads_and_length(declaration, records, directory: str) -> None:
  """heads_length: nmse_by_heads.png, test NMSE against h, a line per length, and the
  proportional decline NMSE(1) (D - h) / (D - 1) of each length dotted."""
  from configs.ablations.heads_length import D, name
  nmse = _nmse(records[measures.RESULTS])
  arms = [tuple(map(int, arm[1:].split("_T"))) for arm in nmse]
  heads, lengths = sorted({h for h, _ in arms}), sorted({t for _, t in arms})
  figure, axis = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
  for k, length in enumerate(lengths):
    means, errors = report_plots.yerr([list(nmse[name(h, length)].values()) for h in heads],
                                      "eval_nmse")
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
  figures.save(figure, os.path.join(directory, "nmse_by_heads.png"), dpi=110)


def accuracy_at_chosen_rates(declaration, records, directory: str) -> None:
  """positional_registered: accuracy_at_chosen_rates.png, each encoding's test accuracy on the
  training lengths and on each longer test set at its chosen rate, a panel per task."""
  from configs.ablations import positional_registered as study
  records = records[measures.RESULTS]
  sets = [("eval_accuracy", f"1-{study.TRAIN_LENGTH}\n(trained)")] + [
      (f"length_{low}_{high}_accuracy", f"{low}-{high}\n({high // study.TRAIN_LENGTH}x)")
      for low, high in study.TEST_LENGTHS]
  by_set = {column: measures.Measure(column).of(records) for column, _ in sets}
  fig, axes = plt.subplots(1, len(study.TASKS), figsize=(figures.WIDTH, 3.6), sharey=True)
  for axis, task in zip(axes, study.TASKS):
    for i, encoding in enumerate(study.ENCODINGS):
      arm = f"{task}-{encoding}"
      mean, errors = report_plots.yerr([list(by_set[column][arm].values())
                                        for column, _ in sets], "eval_accuracy")
      x = [j + 0.05 * (i - 2) for j in range(len(sets))]
      axis.errorbar(x, mean, yerr=errors, marker="os^Dv"[i], capsize=3, label=encoding)
    axis.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    axis.set_xticks(range(len(sets)), [label for _, label in sets])
    axis.set_title(task)
    axis.set_xlabel("test lengths")
  axes[0].set_ylabel("test accuracy at the chosen rate")
  axes[-1].legend(fontsize=8, loc="lower left")
  fig.tight_layout()
  figures.save(fig, os.path.join(directory, "accuracy_at_chosen_rates.png"), dpi=110)


def heads_width(nmse: dict, reference: dict, path: str) -> None:
  """Test NMSE against T ({arm: {seed: NMSE}}, arms d<d_model>_h<h>_T<T>; others left out), a
  panel per head count and a line per d_model, and beside them the idealised reference of that h
  ({arm: its NMSE}; zero where no arm of that h and T has one), dashed."""
  cells = sorted(tuple(int(part[1:]) for part in arm.split("_")) for arm in nmse
                 if arm.startswith("d"))
  heads = sorted({h for _, h, _ in cells})
  figure, axes = plt.subplots(1, len(heads), figsize=(3.6 * len(heads), 3.6), squeeze=False,
                              sharey=True, layout="constrained")
  for axis, h in zip(axes[0], heads):
    widths = sorted({d for d, hh, _ in cells if hh == h})
    for k, d_model in enumerate(widths):
      lengths = [t for d, hh, t in cells if d == d_model and hh == h]
      means, errors = report_plots.yerr(
          [list(nmse[f"d{d_model}_h{h}_T{t}"].values()) for t in lengths], "eval_nmse")
      axis.errorbar([t * 1.04 ** (k - (len(widths) - 1) / 2) for t in lengths], means,
                    yerr=errors,
                    marker="o", capsize=3, color=f"C{k}", label=f"d_model {d_model}")
    lengths = sorted({t for _, hh, t in cells if hh == h})
    ideal = [next((v for arm, v in reference.items() if arm.endswith(f"_h{h}_T{t}")), 0.0)
             for t in lengths]
    axis.plot(lengths, ideal, color="gray", linestyle="--", label="idealised reference")
    axis.set_xscale("log", base=2)
    axis.set_xticks(lengths, [str(t) for t in lengths])
    axis.set_xlabel("sequence length T")
    axis.set_title(f"h = {h}")
    axis.legend(fontsize=8)
  axes[0][0].set_ylabel("test NMSE (mean, 95% interval)")
  figures.save(figure, path, dpi=110)


def nmse_by_length_and_width(declaration, records, directory: str) -> None:
  """heads_width: nmse_by_length.png, the reference read from the declaration (the constants
  its measure ``excess`` subtracts)."""
  heads_width(_nmse(records[measures.RESULTS]),
              dict(declaration["measures"]["excess"]["offsets"]),
              os.path.join(directory, "nmse_by_length.png"))


def rate_transfer(declaration, records, directory: str) -> None:
  """scale_optimiser's mup design: rate_transfer.png, validation accuracy against the learning
  rate (mean and 95% interval over seeds), a panel per logit scale (arms dk<d_k>_<scale>) and a
  line per d_k, each line's best mean marked: where the best rate sits as d_k grows."""
  by_scale = {}
  for record in records[measures.RESULTS]:
    head_dim, _, scale = record["variant"].partition("_")
    by_scale.setdefault(scale, {})[int(head_dim.removeprefix("dk"))] = record
  words = {"inv_sqrt": "1/sqrt(d_k)", "inv": "1/d_k (muP)"}
  figure, axes = plt.subplots(1, len(by_scale), figsize=(3.8 * len(by_scale), 3.6),
                              squeeze=False, sharey=True, layout="constrained")
  for axis, scale in zip(axes[0], sorted(by_scale, key=len, reverse=True)):
    for k, (head_dim, record) in enumerate(sorted(by_scale[scale].items())):
      rows = sorted(verdicts.by_rate(record).items())
      rates = [rate for rate, _ in rows]
      accuracy = record["metrics"]["validation_accuracy"]
      means, errors = report_plots.yerr([[accuracy[i] for i in at] for _, at in rows],
                                        "eval_accuracy")
      axis.errorbar(rates, means, yerr=errors, marker="o", capsize=3, color=f"C{k}",
                    label=f"d_k {head_dim}")
      best = int(np.argmax(np.nan_to_num(means, nan=-np.inf)))  # a diverged rate is never best
      axis.plot(rates[best], means[best], marker="*", markersize=14, color=f"C{k}",
                markeredgecolor="black")
    axis.set_xscale("log")
    tried = sorted({rate for record in by_scale[scale].values()
                    for rate in verdicts.by_rate(record)})
    axis.set_xticks(tried, [f"{r:.2g}" for r in tried], minor=False)
    axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.set_xlabel("learning rate")
    axis.set_title(words.get(scale, scale))
    axis.legend(fontsize=8)
  axes[0][0].set_ylabel("validation accuracy (mean, 95% interval)\n★ best mean rate")
  figures.save(figure, os.path.join(directory, "rate_transfer.png"), dpi=110)


FIGURES = {"nmse_by_heads": nmse_by_heads, "nmse_by_heads_accelerator": nmse_by_heads_accelerator,
           "nmse_by_heads_and_length": nmse_by_heads_and_length,
           "nmse_by_length_and_width": nmse_by_length_and_width,
           "accuracy_at_chosen_rates": accuracy_at_chosen_rates, "rate_transfer": rate_transfer}
