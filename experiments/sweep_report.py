"""A sweep's results as results.csv (one row per variant and replica: seed and hyperparameters),
results.md (mean +- std over seeds per arm: a variant at one hyperparameter setting) and PNG plots:
final metrics with error bars, learning curves, attention probes."""

from __future__ import annotations

import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import logbook, workdir as workdir_lib  # noqa: E402
from experiments.steps import HYPERPARAMETERS  # noqa: E402

LEADING = ("eval_accuracy", "eval_loss")
PROBES = ("logit_variance", "entropy", "max_weight", "query_grad_norm", "key_grad_norm")


IDENTITY = ("name", "seed") + HYPERPARAMETERS  # per-replica columns that are not measurements


def rows(records) -> list[dict]:
  """One dict per (variant, replica); a failed variant gives one row with its error."""
  table = []
  for record in records:
    settings = workdir_lib.flatten(record["overrides"])
    if record["status"] != "ok":
      table.append({"variant": record["variant"], "seed": "", "status": record["status"],
                    **settings, "error": record["error"]})
      continue
    metrics = record["metrics"]
    for index in range(len(metrics["name"])):
      table.append({"variant": record["variant"], "status": "ok", **settings,
                    **{name: values[index] for name, values in metrics.items()
                       if name != "name"}})
  return table


def arms(record) -> list[tuple[str, list[int]]]:
  """(label, replica indices) for each hyperparameter setting of a finished variant, in order:
  the label is the variant's name, followed by the hyperparameters its grid varies."""
  metrics = record["metrics"]
  varied = [name for name in HYPERPARAMETERS if len(set(metrics[name])) > 1]
  groups = {}
  for index in range(len(metrics["name"])):
    groups.setdefault(tuple(metrics[name][index] for name in varied), []).append(index)
  return [(" ".join([record["variant"]] + [f"{n}={v:g}" for n, v in zip(varied, key)]), indices)
          for key, indices in groups.items()]


def _arm_values(records):
  """(label, {metric: values over the arm's seeds}, record) for every arm of every ok record."""
  return [(label, {name: [values[i] for i in indices] for name, values in r["metrics"].items()},
           r) for r in records if r["status"] == "ok" for label, indices in arms(r)]


def metric_names(records) -> list[str]:
  names = set()
  for record in records:
    names.update(name for name in record.get("metrics", {}) if name not in IDENTITY)
  extra_accuracies = sorted(n for n in names if n.endswith("_accuracy") and n not in LEADING and
                            not n.startswith(("init_", "final_")))
  return [n for n in LEADING if n in names] + extra_accuracies + sorted(
      names - set(LEADING) - set(extra_accuracies))


def write_csv(records, path):
  table = rows(records)
  settings = sorted({k for record in records for k in workdir_lib.flatten(record["overrides"])})
  columns = (["variant", "seed", *HYPERPARAMETERS, "status"] + settings + metric_names(records)
             + ["error"])
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
  armed = _arm_values(records)
  columns = _accuracy_columns(records)
  seeds = max((len(metrics["seed"]) for _, metrics, _ in armed), default=0)
  lines = [f"## {title}", "", f"Mean ± std over {seeds} seeds.", "",
           "| variant | " + " | ".join(columns) + " | seconds |",
           "|---" * (len(columns) + 2) + "|"]
  for label, metrics, _ in armed:
    lines.append(f"| {label} | " + " | ".join(_mean_std(metrics[c]) for c in columns)
                 + f" | {metrics['seconds'][0]:.0f} |")
  probes = [p for p in PROBES if armed and f"init_{p}" in armed[0][1]]
  if probes:
    lines += ["", "Attention at initialisation → after training (one test batch; means over "
              "layers, heads and seeds; gradient norms of the loss w.r.t. W_Q and W_K):", "",
              "| variant | " + " | ".join(probes) + " |", "|---" * (len(probes) + 1) + "|"]
    for label, metrics, _ in armed:
      cells = [f"{np.mean(metrics['init_' + p]):.3g} → {np.mean(metrics['final_' + p]):.3g}"
               for p in probes]
      lines.append(f"| {label} | " + " | ".join(cells) + " |")
  failed = [record for record in records if record["status"] != "ok"]
  if failed:
    lines += ["", "Failed variants:", ""] + [f"- {r['variant']}: {r['error']}" for r in failed]
  return "\n".join(lines) + "\n"


def curves(workdir, record, names, metric="eval_accuracy"):
  """Steps and values [replicas, steps] of ``metric`` from the metrics.jsonl of the replicas
  ``names`` of a variant (trained together, or alone under <variant>/alone/)."""
  per_replica = []
  for name in names:
    (path,) = glob.glob(os.path.join(workdir, "variants", record["variant"], "**", "replicas",
                                     name, "metrics.jsonl"), recursive=True)[:1]
    per_replica.append([(line["step"], line[metric]) for line in logbook.lines(path)
                        if metric in line])
  steps = [step for step, _ in per_replica[0]]
  return np.array(steps), np.array([[value for _, value in points] for points in per_replica])


def _bars(axis, labels):
  axis.set_xticks(np.arange(len(labels)), labels, rotation=60, ha="right", fontsize=7)


def plot_final(records, path):
  armed = _arm_values(records)
  columns = [c for c in _accuracy_columns(records) if c.endswith("_accuracy")]
  figure, axes = plt.subplots(1, len(columns),
                              figsize=(max(5, 0.7 * len(armed)) * len(columns), 4), squeeze=False)
  for axis, column in zip(axes[0], columns):
    values = [np.asarray(metrics[column]) for _, metrics, _ in armed]
    x = np.arange(len(armed))
    axis.bar(x, [v.mean() for v in values], yerr=[v.std(ddof=1) if len(v) > 1 else 0
                                                   for v in values], capsize=3, color="#8fb0d8")
    for position, value in zip(x, values):
      axis.scatter(np.full(len(value), position), value, s=8, color="k", zorder=3)
    _bars(axis, [label for label, _, _ in armed])
    axis.set_ylabel(column)
    axis.set_ylim(0, 1.02)
    axis.grid(axis="y", alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_curves(workdir, records, path):
  figure, axis = plt.subplots(figsize=(7, 4.5))
  for label, metrics, record in _arm_values(records):
    steps, values = curves(workdir, record, metrics["name"])
    line, = axis.plot(steps, values.mean(0), label=label, marker=".")
    axis.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
  axis.set_xlabel("step")
  axis.set_ylabel("eval_accuracy (mean; band: min to max over seeds)")
  axis.legend(fontsize=7, ncol=2)
  axis.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_probes(records, path):
  armed = _arm_values(records)
  figure, axes = plt.subplots(1, len(PROBES), figsize=(4 * len(PROBES), 4))
  x = np.arange(len(armed))
  for axis, probe in zip(axes, PROBES):
    for offset, stage in ((-0.2, "init"), (0.2, "final")):
      axis.bar(x + offset, [np.mean(metrics[f"{stage}_{probe}"]) for _, metrics, _ in armed],
               width=0.4, label=stage)
    _bars(axis, [label for label, _, _ in armed])
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
