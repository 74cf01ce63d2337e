"""A sweep's results as results.csv (one row per variant and seed), results.md (mean +- std per
variant) and PNG plots: final metrics with error bars, learning curves, attention probes."""

from __future__ import annotations

import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import config_check, logbook  # noqa: E402

LEADING = ("eval_accuracy", "eval_loss")
PROBES = ("logit_variance", "entropy", "max_weight", "query_grad_norm", "key_grad_norm")


def rows(records) -> list[dict]:
  """One dict per (variant, seed); a failed variant gives one row with its error."""
  table = []
  for record in records:
    settings = config_check.flatten(record["overrides"])
    if record["status"] != "ok":
      table.append({"variant": record["variant"], "seed": "", "status": record["status"],
                    **settings, "error": record["error"]})
      continue
    metrics = record["metrics"]
    for index, seed in enumerate(metrics["seed"]):
      table.append({"variant": record["variant"], "seed": seed, "status": "ok", **settings,
                    **{name: values[index] for name, values in metrics.items() if name != "seed"}})
  return table


def metric_names(records) -> list[str]:
  names = set()
  for record in records:
    names.update(name for name in record.get("metrics", {}) if name != "seed")
  extra_accuracies = sorted(n for n in names if n.endswith("_accuracy") and n not in LEADING and
                            not n.startswith(("init_", "final_")))
  return [n for n in LEADING if n in names] + extra_accuracies + sorted(
      names - set(LEADING) - set(extra_accuracies))


def write_csv(records, path):
  table = rows(records)
  settings = sorted({k for record in records for k in config_check.flatten(record["overrides"])})
  columns = ["variant", "seed", "status"] + settings + metric_names(records) + ["error"]
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, restval="")
    writer.writeheader()
    writer.writerows(table)


def _mean_std(values, digits=3):
  values = np.asarray(values, np.float64)
  spread = values.std(ddof=1) if len(values) > 1 else 0.0
  return f"{values.mean():.{digits}f} ± {spread:.{digits}f}"


def _accuracy_columns(records):
  return [n for n in metric_names(records) if n.endswith(("_accuracy", "_loss")) and
          not n.startswith(("init_", "final_"))]


def markdown(title, records) -> str:
  ok = [record for record in records if record["status"] == "ok"]
  columns = _accuracy_columns(records)
  seeds = max((len(record["metrics"]["seed"]) for record in ok), default=0)
  lines = [f"## {title}", "", f"Mean ± std over {seeds} seeds.", "",
           "| variant | " + " | ".join(columns) + " | seconds |",
           "|---" * (len(columns) + 2) + "|"]
  for record in ok:
    metrics = record["metrics"]
    lines.append(f"| {record['variant']} | " + " | ".join(_mean_std(metrics[c]) for c in columns)
                 + f" | {metrics['seconds'][0]:.0f} |")
  probes = [p for p in PROBES if ok and f"init_{p}" in ok[0]["metrics"]]
  if probes:
    lines += ["", "Attention at initialisation → after training (one test batch; means over "
              "layers, heads and seeds; gradient norms of the loss w.r.t. W_Q and W_K):", "",
              "| variant | " + " | ".join(probes) + " |", "|---" * (len(probes) + 1) + "|"]
    for record in ok:
      metrics = record["metrics"]
      cells = [f"{np.mean(metrics['init_' + p]):.3g} → {np.mean(metrics['final_' + p]):.3g}"
               for p in probes]
      lines.append(f"| {record['variant']} | " + " | ".join(cells) + " |")
  failed = [record for record in records if record["status"] != "ok"]
  if failed:
    lines += ["", "Failed variants:", ""] + [f"- {r['variant']}: {r['error']}" for r in failed]
  return "\n".join(lines) + "\n"


def curves(workdir, record, metric="eval_accuracy"):
  """Steps and values [seeds, steps] of ``metric`` from each seed's metrics.jsonl."""
  per_seed = []
  for seed in record["metrics"]["seed"]:
    (path,) = glob.glob(os.path.join(workdir, "variants", record["variant"], "**",
                                     f"seed_{seed}"), recursive=True)[:1]
    points = [(line["step"], line[metric]) for line in logbook.read(path) if metric in line]
    per_seed.append(points)
  steps = [step for step, _ in per_seed[0]]
  return np.array(steps), np.array([[value for _, value in points] for points in per_seed])


def plot_final(records, path):
  ok = [record for record in records if record["status"] == "ok"]
  columns = [c for c in _accuracy_columns(records) if c.endswith("_accuracy")]
  figure, axes = plt.subplots(1, len(columns), figsize=(max(5, 0.7 * len(ok)) * len(columns), 4),
                              squeeze=False)
  for axis, column in zip(axes[0], columns):
    values = [np.asarray(record["metrics"][column]) for record in ok]
    x = np.arange(len(ok))
    axis.bar(x, [v.mean() for v in values], yerr=[v.std(ddof=1) if len(v) > 1 else 0
                                                   for v in values], capsize=3, color="#8fb0d8")
    for position, value in zip(x, values):
      axis.scatter(np.full(len(value), position), value, s=8, color="k", zorder=3)
    axis.set_xticks(x, [record["variant"] for record in ok], rotation=60, ha="right", fontsize=8)
    axis.set_ylabel(column)
    axis.set_ylim(0, 1.02)
    axis.grid(axis="y", alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_curves(workdir, records, path):
  figure, axis = plt.subplots(figsize=(7, 4.5))
  for record in (r for r in records if r["status"] == "ok"):
    steps, values = curves(workdir, record)
    line, = axis.plot(steps, values.mean(0), label=record["variant"], marker=".")
    axis.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
  axis.set_xlabel("step")
  axis.set_ylabel("eval_accuracy (mean; band: min to max over seeds)")
  axis.legend(fontsize=7, ncol=2)
  axis.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_probes(records, path):
  ok = [record for record in records if record["status"] == "ok"]
  figure, axes = plt.subplots(1, len(PROBES), figsize=(4 * len(PROBES), 4))
  x = np.arange(len(ok))
  for axis, probe in zip(axes, PROBES):
    for offset, stage in ((-0.2, "init"), (0.2, "final")):
      axis.bar(x + offset, [np.mean(r["metrics"][f"{stage}_{probe}"]) for r in ok], width=0.4,
               label=stage)
    axis.set_xticks(x, [r["variant"] for r in ok], rotation=60, ha="right", fontsize=7)
    axis.set_title(probe)
    if probe in ("logit_variance", "query_grad_norm", "key_grad_norm"):
      axis.set_yscale("log")
  axes[0].legend()
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def write(records, workdir) -> dict:
  """Writes the tables and plots; returns their paths by kind."""
  title = os.path.basename(os.path.normpath(workdir))
  paths = {"csv": os.path.join(workdir, "results.csv"),
           "markdown": os.path.join(workdir, "results.md")}
  write_csv(records, paths["csv"])
  with open(paths["markdown"], "w") as f:
    f.write(markdown(title, records))
  if any(record["status"] == "ok" for record in records):
    paths.update(final=os.path.join(workdir, "final_metrics.png"),
                 curves=os.path.join(workdir, "learning_curves.png"),
                 probes=os.path.join(workdir, "probes.png"))
    plot_final(records, paths["final"])
    plot_curves(workdir, records, paths["curves"])
    plot_probes(records, paths["probes"])
  return paths
