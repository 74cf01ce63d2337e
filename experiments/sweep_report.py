"""A sweep's results as results.csv (one row per variant and replica: seed and hyperparameters),
results.md (per arm, a variant at one hyperparameter setting: means with 95% intervals over seeds,
Welch's test against the best arm, diverged runs; the best learning rate per variant with steps to
90% and LR sensitivity; attention-logit maxima) and PNG plots: final metrics, learning curves,
accuracy against learning rate, accuracy by test set (longer sequences), attention-logit maxima
through training, attention probes.

The plots that need only results.csv (final metrics, learning rates, test sets, probes) can be
drawn again from a committed CSV, without the run's workdir:

  python -m experiments.sweep_report --from_csv=docs/results/heads/results.csv
"""

from __future__ import annotations

import argparse
import csv
import glob
import math
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import logbook, statistics, workdir as workdir_lib  # noqa: E402
from experiments.steps import HYPERPARAMETERS, MEASURES  # noqa: E402

LEADING = ("eval_accuracy", "eval_nmse", "eval_loss")
# The extra test set, when a sweep has one by this name, that picks each variant's learning rate
# (a stream apart from the test set, which then reports the choice without having made it).
VALIDATION = "validation"
REACHED = {"accuracy": 0.9, "nmse": 0.1}  # "steps to" this accuracy, or down to this NMSE
MAX_LOGIT = "max_attention_logit"
PROBES = ("logit_variance", "entropy", "max_weight", "negative_weight", "first_token_weight",
          "max_activation", "query_grad_norm", "key_grad_norm")


# per-replica columns that are not measurements
IDENTITY = ("name", "seed", "num_classes", "diverged_at", "parameters") + HYPERPARAMETERS


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
  extra_accuracies = sorted(n for n in names if n.endswith(("_accuracy", "_nmse")) and
                            n not in LEADING and not n.startswith(("init_", "final_")))
  return [n for n in LEADING if n in names] + extra_accuracies + sorted(
      names - set(LEADING) - set(extra_accuracies))


def write_csv(records, path):
  table = rows(records)
  settings = sorted({k for record in records for k in workdir_lib.flatten(record["overrides"])})
  columns = (["variant", "seed", *HYPERPARAMETERS, "status", "diverged_at"] + settings
             + metric_names(records) + ["num_classes", "parameters", "error"])
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, restval="")
    writer.writeheader()
    writer.writerows(table)


# Names of measures as a reader knows them; any other name is spelled out from its key.
READABLE = {"eval_accuracy": "Test accuracy", "eval_nmse": "Test NMSE (MSE / target variance)",
            "eval_loss": "Test loss", "loss": "Training loss",
            "eval": "test (training lengths)", MAX_LOGIT: "Largest attention logit",
            "learning_rate": "lr"}
INTERVAL_NOTE = "95% t-interval over seeds, clipped to the possible range"
INTERVAL_LINES = INTERVAL_NOTE.replace("seeds, ", "seeds,\n")  # for an axis label


def readable(name: str) -> str:
  """A key as a plot's reader reads it.

  >>> readable("eval_accuracy"), readable("length_21_40_accuracy"), readable("length_21_40")
  ('Test accuracy', 'Test accuracy, length 21-40', 'length 21-40')
  >>> readable("final_logit_variance")
  'Final logit variance'
  """
  if name in READABLE:
    return READABLE[name]
  match = re.fullmatch(r"length_(\d+)_(\d+)(?:_(accuracy|loss|nmse))?", name)
  if match:
    low, high, measure = match.groups()
    return (f"Test {measure}, " if measure else "") + f"length {low}-{high}"
  return name.replace("_", " ").capitalize()


def readable_arm(label: str) -> str:
  """An arm's label (the variant's name, then the hyperparameters its grid varies), shortened.

  >>> readable_arm("heads_4 learning_rate=0.001 warmup_steps=10")
  'heads_4 lr=0.001 warmup_steps=10'
  """
  return re.sub(r"\b(\w+)=", lambda m: READABLE.get(m.group(1), m.group(1)) + "=", label)


def metric_range(name: str) -> tuple[float, float]:
  """The values a measure can take: an accuracy [0, 1], a loss or an NMSE [0, inf), else
  unbounded."""
  if name.endswith("accuracy"):
    return 0.0, 1.0
  if name.endswith(("loss", "nmse")):
    return 0.0, math.inf
  return -math.inf, math.inf


def _yerr(values_per_point, name):
  """Means and the [below, above] error-bar lengths of bounded_interval, for matplotlib."""
  means, lows, highs = (np.array(v) for v in zip(*(
      statistics.bounded_interval(values, *metric_range(name)) for values in values_per_point)))
  return means, np.nan_to_num(np.stack([means - lows, highs - means]))


def _ci(values, name="", digits=3) -> str:
  """Mean ± the 95% half-width, or mean [low, high] where the interval would pass the range of
  the measure ``name`` (an NMSE near 0, an accuracy near 1); small means in significant digits."""
  mean, half = statistics.interval(values)
  if math.isnan(mean):
    return "diverged"
  number = (lambda x: f"{x:.2g}") if 0 < abs(mean) < 10 ** -(digits - 1) else (
      lambda x: f"{x:.{digits}f}")
  if math.isnan(half):
    return number(mean)
  _, low, high = statistics.bounded_interval(values, *metric_range(name))
  if low > mean - half or high < mean + half:
    return f"{number(mean)} [{number(low)}, {number(high)}]"
  return f"{number(mean)} ± {number(half)}"


def _accuracy_columns(records):
  return [n for n in metric_names(records) if n.endswith(("_accuracy", "_nmse", "_loss")) and
          not n.startswith(("init_", "final_"))]


def measure_of(metrics) -> str:
  """The measure of success of these metrics (or records): "accuracy" for classes, "nmse" for
  real-valued targets (lower is better)."""
  names = metrics if isinstance(metrics, dict) else {
      name for record in metrics if record["status"] == "ok" for name in record["metrics"]}
  return next((m for m in MEASURES if f"eval_{m}" in names), "accuracy")


def primary(metrics) -> str:
  """The column arms are ranked and tested by."""
  return f"eval_{measure_of(metrics)}"


def _group(record) -> str:
  """Arms are compared within a group: the variants that train the same task."""
  return str(record["overrides"].get("task", ""))


def _p_cell(p) -> str:
  if math.isnan(p):
    return "—"
  return f"{p:.2g}" + (" *" if p < statistics.SIGNIFICANT else "")


def _score(metrics, prefix="eval") -> tuple[float, float]:
  """What ranks arms (higher is better): the mean of the measure on the ``prefix`` test set,
  negated for a measure where lower is better, ties broken by the lower mean loss there."""
  measure = measure_of(metrics)
  sign = 1.0 if MEASURES[measure] else -1.0
  return (sign * statistics.interval(metrics[f"{prefix}_{measure}"])[0],
          -statistics.interval(metrics[f"{prefix}_loss"])[0])


def _best(armed, prefix="eval"):
  """The arm (label, metrics, record) with the best _score on the ``prefix`` test set (diverged
  seeds left out), or None."""
  scored = [arm for arm in armed if np.isfinite(_score(arm[1], prefix)[0])]
  return max(scored, key=lambda arm: _score(arm[1], prefix)) if scored else None


def _varies_learning_rate(records) -> bool:
  return any(len(set(r["metrics"]["learning_rate"])) > 1 for r in records if r["status"] == "ok")


def chosen_on(records) -> str:
  """The test set that picks learning rates: VALIDATION when the records have it, else eval."""
  finished = [r for r in records if r["status"] == "ok"]
  return VALIDATION if finished and all(f"{VALIDATION}_loss" in r["metrics"]
                                        for r in finished) else "eval"


def best_learning_rates(records) -> list[tuple[str, float, dict, dict]]:
  """(variant, learning rate, metrics of that arm, record) per finished variant: the arm of its
  learning-rate grid with the best mean measure (highest accuracy, lowest NMSE; ties: the lower
  loss) on the validation set when the sweep has one (chosen_on), else on the test set."""
  chosen, prefix = [], chosen_on(records)
  for record in records:
    if record["status"] != "ok":
      continue
    armed = _arm_values([record])
    best = _best(armed, prefix) or armed[0]
    chosen.append((record["variant"], best[1]["learning_rate"][0], best[1], record))
  return chosen


def markdown(title, records, workdir=None) -> str:
  """The report. With ``workdir`` (where the variants' metrics.jsonl are) it adds the steps to
  90% accuracy and the attention-logit maxima, which come from the training logs."""
  armed = _arm_values(records)
  columns = _accuracy_columns(records)
  measure = primary(records)
  seeds = max((len(metrics["seed"]) for _, metrics, _ in armed), default=0)
  lines = [f"## {title}", "",
           f"Mean ± half-width of the 95% Student-t interval over {seeds} seeds (mean [low, high], "
           "the interval clipped, where it would pass the measure's range). A run whose "
           "loss went non-finite is 'diverged': it is left out of the means and counted. "
           f"p: Welch's t-test of {measure} against the best arm training the same task "
           f"(* p < {statistics.SIGNIFICANT}).", "",
           "| variant | " + " | ".join(columns) + " | p | diverged | seconds |",
           "|---" * (len(columns) + 4) + "|"]
  best = {group: _best([a for a in armed if _group(a[2]) == group])
          for group in {_group(r) for _, _, r in armed}}
  for label, metrics, record in armed:
    reference = best[_group(record)]
    p = (math.nan if reference is None or reference[0] == label
         else statistics.welch_p(metrics[measure], reference[1][measure]))
    diverged = sum(1 for step in metrics.get("diverged_at", []) if step)
    lines.append(f"| {label} | " + " | ".join(_ci(metrics[c], c) for c in columns)
                 + f" | {_p_cell(p)} | {diverged} | {metrics['seconds'][0]:.0f} |")
  if _varies_learning_rate(records):
    lines += _best_lr_section(records, workdir)
  if workdir is not None and armed and _logged(workdir, armed[0][2], armed[0][1]["name"],
                                               MAX_LOGIT):
    lines += ["", f"Largest attention logit (over layers, heads and a training batch) at the "
              "last log step, and its peak during training (mean over seeds; diverged runs "
              "included):", "", "| variant | final | peak |", "|---|---|---|"]
    for label, metrics, record in armed:
      _, values = curves(workdir, record, metrics["name"], MAX_LOGIT)
      lines.append(f"| {label} | {np.mean(values[:, -1]):.3g} | "
                   f"{np.mean(np.max(values, axis=1)):.3g} |")
  probes = [p for p in PROBES if armed and f"init_{p}" in armed[0][1]]
  if probes:
    lines += ["", "Attention at initialisation → after training (one test batch; means over "
              "layers, heads and seeds; gradient norms of the loss w.r.t. W_Q and W_K):", "",
              "| variant | " + " | ".join(probes) + " |", "|---" * (len(probes) + 1) + "|"]
    for label, metrics, _ in armed:
      cells = [f"{np.nanmean(metrics['init_' + p]):.3g} → {np.nanmean(metrics['final_' + p]):.3g}"
               for p in probes]
      lines.append(f"| {label} | " + " | ".join(cells) + " |")
  failed = [record for record in records if record["status"] != "ok"]
  if failed:
    lines += ["", "Failed variants:", ""] + [f"- {r['variant']}: {r['error']}" for r in failed]
  return "\n".join(lines) + "\n"


def _best_lr_section(records, workdir) -> list[str]:
  chosen = best_learning_rates(records)
  measure, prefix = measure_of(records), chosen_on(records)
  column, better, target = f"eval_{measure}", MEASURES[measure], REACHED[measure]
  groups = {}
  for entry in chosen:
    groups.setdefault(_group(entry[3]), []).append(entry)
  if prefix == VALIDATION:
    how = (f"the grid value with the {'highest' if better else 'lowest'} mean {prefix}_{measure}, "
           "a stream apart from the test set that the other columns report")
  else:
    how = (f"the grid value with the {'highest' if better else 'lowest'} mean {column}; "
           "choosing it on the same seeds flatters it a little")
  sensitivity = ("eval_loss over the grid, a diverged run counting as ln(classes), the loss at "
                 "initialisation" if better else "eval_nmse over the grid, a diverged run "
                 "counting as 1, the NMSE of predicting the mean")
  lines = ["", f"Best learning rate per variant ({how}). p: against the best variant of the "
           f"same task. Steps to {target:g}: the first evaluation at "
           f"{'or above' if better else 'or below'} {target:g}, mean over the seeds that got "
           f"there. LR sensitivity: Wortsman et al. (2023) eq. 1 on {sensitivity}.",
           "", f"| variant | learning rate | {column} | eval_loss | p | steps to {target:g} | "
           "LR sensitivity | parameters |", "|---|---|---|---|---|---|---|---|"]
  sign = 1.0 if better else -1.0
  for group, entries in groups.items():
    top = max((entry for entry in entries if np.isfinite(_score(entry[2])[0])),
              key=lambda entry: _score(entry[2]), default=None)
    for variant, rate, metrics, record in entries:
      p = (math.nan if top is None or variant == top[0]
           else statistics.welch_p(metrics[column], top[2][column]))
      reach = "—"
      if workdir is not None:
        steps, values = curves(workdir, record, metrics["name"], column)
        hits = [statistics.first_step_reaching(steps, sign * row, sign * target)
                for row in values]
        reached = [h for h in hits if not math.isnan(h)]
        reach = (f"{np.mean(reached):.0f} ({len(reached)}/{len(hits)})" if reached
                 else f"never (0/{len(hits)})")
      lost = "eval_loss" if better else column
      losses = [statistics.interval(m[lost])[0] for _, m, r in _arm_values([record])]
      initial = math.log(record["metrics"].get("num_classes", [2])[0]) if better else 1.0
      lines.append(f"| {variant} | {rate:g} | {_ci(metrics[column], column)} | "
                   f"{_ci(metrics['eval_loss'], 'eval_loss')} | {_p_cell(p)} | {reach} | "
                   f"{statistics.lr_sensitivity(losses, initial):.3f} | "
                   f"{record['metrics'].get('parameters', ['—'])[0]} |")
  return lines


def curves(workdir, record, names, metric="eval_accuracy"):
  """Steps and values [replicas, steps] of ``metric`` from the metrics.jsonl of the replicas
  ``names`` of a variant (trained together, or alone under <variant>/alone/)."""
  per_replica = []
  for name in names:
    (path,) = glob.glob(os.path.join(workdir, "variants", record["variant"], "**", "replicas",
                                     name, "metrics.jsonl"), recursive=True)[:1] or [None]
    if path is None:
      raise ValueError(f"no metrics.jsonl for replica {name} of variant {record['variant']}")
    per_replica.append([(line["step"], line[metric]) for line in logbook.lines(path)
                        if metric in line])
  steps = [step for step, _ in per_replica[0]]
  return np.array(steps), np.array([[value for _, value in points] for points in per_replica])


def _logged(workdir, record, names, metric) -> bool:
  try:
    steps, _ = curves(workdir, record, names[:1], metric)
  except ValueError:  # no metrics.jsonl for the replica
    return False
  return len(steps) > 0


def _bars(axis, labels):
  axis.set_xticks(np.arange(len(labels)), labels, rotation=60, ha="right", fontsize=7)


def plot_final(records, path):
  armed = _arm_values(records)
  columns = [c for c in _accuracy_columns(records) if c.endswith(("_accuracy", "_nmse"))]
  figure, axes = plt.subplots(1, len(columns),
                              figsize=(max(5, 0.7 * len(armed)) * len(columns), 4), squeeze=False)
  for axis, column in zip(axes[0], columns):
    values = [np.asarray(metrics[column], np.float64) for _, metrics, _ in armed]
    x = np.arange(len(armed))
    means, errors = _yerr(values, column)
    axis.bar(x, means, yerr=errors, capsize=3, color="#8fb0d8", label="mean, " + INTERVAL_NOTE)
    for position, value in zip(x, values):
      axis.scatter(np.full(len(value), position), value, s=8, color="k", zorder=3,
                   label="one seed" if position == 0 else None)
    _bars(axis, [readable_arm(label) for label, _, _ in armed])
    axis.set_ylabel(readable(column))
    if column.endswith("_accuracy"):
      axis.set_ylim(0, 1.02)
    axis.legend(fontsize=6, loc="lower left", bbox_to_anchor=(0, 1), ncol=2, frameon=False)
    axis.grid(axis="y", alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_best_learning_rates(records, path):
  """Each variant at its best learning rate (best_learning_rates): the mean of every accuracy
  column as a bar, the seeds as dots, the 95% interval clipped to [0, 1]."""
  chosen = best_learning_rates(records)
  columns = [c for c in _accuracy_columns(records) if c.endswith(("_accuracy", "_nmse"))]
  figure, axes = plt.subplots(len(columns), 1, squeeze=False, sharex=True,
                              figsize=(max(6, 0.45 * len(chosen) + 1.5), 2.8 * len(columns) + 1))
  x = np.arange(len(chosen))
  for axis, column in zip(axes[:, 0], columns):
    values = [np.asarray(metrics[column], np.float64) for _, _, metrics, _ in chosen]
    means, errors = _yerr(values, column)
    axis.bar(x, means, yerr=errors, capsize=3, color="#8fb0d8")
    for position, value in zip(x, values):
      axis.scatter(np.full(len(value), position), value, s=8, color="k", zorder=3)
    axis.set_ylabel(readable(column), fontsize=8)
    if column.endswith("_accuracy"):
      axis.set_ylim(0, 1.02)
    axis.grid(axis="y", alpha=0.3)
  _bars(axes[-1, 0], [f"{variant} (lr={rate:g})" for variant, rate, _, _ in chosen])
  axes[0, 0].set_title("Each variant at its best learning rate: mean (bar), seeds (dots),\n"
                       + INTERVAL_NOTE, fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_curves(workdir, records, path):
  """Eval accuracy (or NMSE) against step: every arm, or each variant's best learning rate when
  the grid varies it."""
  if _varies_learning_rate(records):
    shown = [(f"{variant} lr={rate:g}", metrics, record)
             for variant, rate, metrics, record in best_learning_rates(records)]
  else:
    shown = _arm_values(records)
  column = primary(records)
  figure, axis = plt.subplots(figsize=(7, 4.5))
  for label, metrics, record in shown:
    steps, values = curves(workdir, record, metrics["name"], column)
    line, = axis.plot(steps, np.nanmean(values, 0), label=readable_arm(label), marker=".")
    axis.fill_between(steps, np.nanmin(values, 0), np.nanmax(values, 0), color=line.get_color(),
                      alpha=0.15)
  axis.set_xlabel("step")
  axis.set_ylabel(f"{readable(column)} (mean; band: min to max over seeds)")
  axis.legend(fontsize=7, ncol=2)
  axis.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def _errorbar(axis, x, per_point, label, metric):
  """Means with 95% intervals, clipped to ``metric``'s range, of the values at each x (NaN, a
  diverged run, left out)."""
  means, errors = _yerr(per_point, metric)
  axis.errorbar(x, means, yerr=errors, label=readable_arm(label), marker="o", ms=3, capsize=2)


def _panels(records) -> dict[str, list[dict]]:
  """The finished records split by the first override that varies between them, when more than
  one does (scaling: a panel per d_k, a line per scale); otherwise one panel."""
  finished = [r for r in records if r["status"] == "ok"]
  settings = [workdir_lib.flatten(r["overrides"]) for r in finished]
  keys = list(dict.fromkeys(k for s in settings for k in s))
  varying = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]
  if len(varying) < 2:
    return {"": finished}
  panels = {}
  for record, setting in zip(finished, settings):
    panels.setdefault(f"{varying[0]} = {setting.get(varying[0])}", []).append(record)
  return panels


def plot_learning_rates(records, path):
  """Final eval accuracy or NMSE (top) and loss (bottom) against the learning rate, a line per
  variant, a column per _panels group."""
  panels = _panels(records)
  shown = (primary(records), "eval_loss")
  figure, axes = plt.subplots(2, len(panels), figsize=(5.5 * len(panels), 8), squeeze=False,
                              sharey="row")
  for column, (title, members) in zip(axes.T, panels.items()):
    for record in members:
      armed = _arm_values([record])
      rates = [metrics["learning_rate"][0] for _, metrics, _ in armed]
      for axis, metric in zip(column, shown):
        _errorbar(axis, rates, [metrics[metric] for _, metrics, _ in armed], record["variant"],
                  metric)
    column[0].set_title(title, fontsize=9)
    column[0].legend(fontsize=6)
    for axis, metric in zip(column, shown):
      axis.set_xscale("log")
      axis.set_xlabel("peak learning rate")
      axis.grid(alpha=0.3)
  for axis, metric in zip(axes[:, 0], shown):
    axis.set_ylabel(f"{readable(metric)} (mean, {INTERVAL_LINES};"
                    "\ndiverged runs left out)", fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_lengths(records, evaluations, path):
  """Accuracy (or NMSE) on each test set in order (the training distribution's first, then the
  others: longer sequences, a validation stream), a line per arm, a panel per task."""
  measure = measure_of(records)
  groups = {}
  for arm in _arm_values(records):
    groups.setdefault(_group(arm[2]), []).append(arm)
  figure, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
  for axis, (group, armed) in zip(axes[0], groups.items()):
    for label, metrics, _ in armed:
      _errorbar(axis, np.arange(len(evaluations)),
                [metrics[f"{name}_{measure}"] for name in evaluations], label, measure)
    axis.set_xticks(np.arange(len(evaluations)), [readable(name) for name in evaluations],
                    fontsize=8)
    axis.set_xlabel("test set")
    axis.set_title(group or f"{readable('eval_' + measure)} by test set", fontsize=9)
    axis.set_ylabel(f"{readable('eval_' + measure)} (mean, {INTERVAL_LINES})", fontsize=8)
    if measure == "accuracy":
      axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=6)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_max_logits(workdir, records, path):
  """The largest attention logit against step: a panel per variant, a line per learning rate
  (mean over seeds), on a log scale."""
  finished = [r for r in records if r["status"] == "ok"]
  columns = min(len(finished), 5)
  rows_ = -(-len(finished) // columns)
  figure, axes = plt.subplots(rows_, columns, figsize=(3.4 * columns, 2.8 * rows_),
                              squeeze=False, sharey=True)
  for axis, record in zip(axes.flat, finished):
    armed = _arm_values([record])
    for label, metrics, _ in armed:
      steps, values = curves(workdir, record, metrics["name"], MAX_LOGIT)
      axis.plot(steps, np.mean(values, 0),
                label=readable_arm(label.replace(record["variant"], "").strip()))
    axis.set_yscale("log")
    axis.set_title(record["variant"], fontsize=8)
    axis.grid(alpha=0.3)
    if len(armed) > 1:
      axis.legend(fontsize=5)
  for axis in axes.flat[len(finished):]:
    axis.axis("off")
  figure.supxlabel("step")
  figure.supylabel(readable(MAX_LOGIT) + " (mean over seeds)")
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def plot_probes(records, path):
  armed = _arm_values(records)
  shown = [p for p in PROBES if f"final_{p}" in armed[0][1]]  # older runs lack negative_weight
  figure, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 4), squeeze=False)
  axes = axes[0]
  x = np.arange(len(armed))
  for axis, probe in zip(axes, shown):
    for offset, stage in ((-0.2, "init"), (0.2, "final")):
      axis.bar(x + offset, [np.mean(metrics[f"{stage}_{probe}"]) for _, metrics, _ in armed],
               width=0.4, label={"init": "at initialisation", "final": "after training"}[stage])
    _bars(axis, [readable_arm(label) for label, _, _ in armed])
    axis.set_title(readable(probe) + " (mean over seeds)", fontsize=9)
    if probe in ("logit_variance", "query_grad_norm", "key_grad_norm"):
      axis.set_yscale("log")
  axes[0].legend()
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def write(records, workdir, evaluations=()) -> dict:
  """Writes the tables and plots; returns their paths by kind. ``evaluations``: the names of the
  sweep's extra test sets, in order (plotted after the training distribution's "eval")."""
  title = os.path.basename(os.path.normpath(workdir))
  paths = {"csv": os.path.join(workdir, "results.csv"),
           "markdown": os.path.join(workdir, "results.md")}
  write_csv(records, paths["csv"])
  with open(paths["markdown"], "w") as f:
    f.write(markdown(title, records, workdir))
  finished = [record for record in records if record["status"] == "ok"]
  if not finished:
    return paths
  paths.update(_plot_results(records, workdir, evaluations))
  paths["curves"] = os.path.join(workdir, "learning_curves.png")
  plot_curves(workdir, records, paths["curves"])
  if _logged(workdir, finished[0], finished[0]["metrics"]["name"], MAX_LOGIT):
    paths["max_logits"] = os.path.join(workdir, "max_attention_logits.png")
    plot_max_logits(workdir, records, paths["max_logits"])
  return paths


def _number(text: str):
  try:
    value = float(text)
  except ValueError:
    return text
  return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def records_from_csv(path) -> list[dict]:
  """The finished records as far as results.csv holds them: per variant its overrides (the
  columns between ``diverged_at`` and the first measure) and every measure per replica, in the
  file's order. Enough for the plots that need no metrics.jsonl."""
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    columns = reader.fieldnames
    table = list(reader)
  first_measure = next(i for i, c in enumerate(columns) if c in LEADING)
  settings = columns[columns.index("diverged_at") + 1:first_measure]
  records = {}
  for row in table:
    if row["status"] != "ok":
      continue
    record = records.setdefault(row["variant"], {
        "variant": row["variant"], "status": "ok", "metrics": {"name": []},
        "overrides": {k: _number(row[k]) for k in settings if row[k] != ""}})
    metrics = record["metrics"]
    metrics["name"].append(f"seed_{row['seed']}_{len(metrics['name'])}")
    for column in columns:
      if column in ("variant", "status", "error", *settings) or row[column] == "":
        continue
      metrics.setdefault(column, []).append(_number(row[column]))
  return list(records.values())


def write_from_csv(csv_path) -> dict:
  """Draws again, beside ``csv_path``, the plots that results.csv alone determines: final
  metrics, probes, accuracy against learning rate and at the best one (when the grid varies it)
  and by test set (when the sweep had extra test sets). Returns their paths by kind."""
  records = records_from_csv(csv_path)
  evaluations = sorted({m.removesuffix("_accuracy") for m in metric_names(records)
                        if re.fullmatch(r"length_\d+_\d+_accuracy", m)},
                       key=lambda name: int(name.split("_")[1]))
  return _plot_results(records, os.path.dirname(os.path.abspath(csv_path)), evaluations)


def _plot_results(records, directory, evaluations) -> dict:
  """The plots drawn from the records' final metrics alone (no metrics.jsonl): their paths."""
  paths = {"final": os.path.join(directory, "final_metrics.png"),
           "probes": os.path.join(directory, "probes.png")}
  plot_final(records, paths["final"])
  plot_probes(records, paths["probes"])
  if _varies_learning_rate(records):
    paths["learning_rates"] = os.path.join(directory, "learning_rates.png")
    plot_learning_rates(records, paths["learning_rates"])
    paths["best_learning_rates"] = os.path.join(directory, "best_learning_rates.png")
    plot_best_learning_rates(records, paths["best_learning_rates"])
  if evaluations:
    paths["lengths"] = os.path.join(directory, "accuracy_by_test_set.png")
    plot_lengths(records, ("eval", *evaluations), paths["lengths"])
  return paths


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=write_from_csv.__doc__)
  parser.add_argument("--from_csv", required=True, nargs="+", help="results.csv files")
  for csv_path in parser.parse_args().from_csv:
    for kind, path in write_from_csv(csv_path).items():
      print(f"{kind}: {path}")
