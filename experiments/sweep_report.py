"""A sweep's results: results.csv (one row per variant and replica: seed, hyperparameters,
every measure, the study's design and the run's provenance), comparisons.csv (one row per
declared comparison at the chosen rates, then again at matched rates: statistics.Comparison.FIELDS;
read back by :func:`read_comparisons`, old files without margin and rate too),
results.md (experiments/report_tables.py) and the figures (experiments/report_plots.py).

Everything but the learning curves and logit plots is made again from a committed CSV, without
the run's workdir; several CSVs at once:

  python -m experiments.sweep_report --from_csv docs/results/heads/results.csv [PATH ...]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re

import numpy as np

from experiments import logbook, provenance, report_plots, report_tables, statistics, verdicts
from experiments import workdir as workdir_lib
from experiments.report_tables import FINAL_LOGIT, LEADING, MAX_LOGIT, PEAK_LOGIT, measure_of
from experiments.steps import HYPERPARAMETERS


def rows(records, design: verdicts.Design | None = None) -> list[dict]:
  """One dict per (variant, replica); a failed variant gives one row with its error."""
  table = []
  for record in records:
    settings = workdir_lib.flatten(record["overrides"])
    extra = {**(design.columns(record["variant"]) if design else {}),
             **record.get("provenance", {})}
    if record["status"] != "ok":
      table.append({"variant": record["variant"], "seed": "", "status": record["status"],
                    **settings, "error": record["error"], **extra})
      continue
    metrics = record["metrics"]
    for index in range(len(metrics["name"])):
      table.append({"variant": record["variant"], "status": "ok", **settings,
                    **{name: values[index] for name, values in metrics.items()
                       if name != "name"}, **extra})
  return table


def write_csv(records, path, design: verdicts.Design | None = None):
  settings = sorted({k for record in records for k in workdir_lib.flatten(record["overrides"])})
  columns = list(dict.fromkeys(  # a metric also named below (a time-to-threshold) written once
      ["variant", "seed", *HYPERPARAMETERS, "status", "diverged_at"] + settings
      + report_tables.metric_names(records) + ["num_classes", "parameters", "error"]
      + [c for c in (verdicts.STEPS_TO, verdicts.VALIDATION_STEPS_TO, FINAL_LOGIT, PEAK_LOGIT)
         if any(c in r.get("metrics", {}) for r in records)]
      + list(verdicts.COLUMNS) * (design is not None) + list(provenance.FIELDS)))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, restval="")
    writer.writeheader()
    writer.writerows(rows(records, design))


def write_comparisons(comparisons, path):
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(statistics.Comparison.FIELDS)
    for c in comparisons:
      writer.writerow([getattr(c, name) for name in statistics.Comparison.FIELDS])


def read_comparisons(path) -> list[statistics.Comparison]:
  """The rows of a comparisons.csv, from before the margin and rate columns (every row then
  "chosen") or after."""
  with open(path, newline="") as f:
    return [statistics.Comparison.of_row(row) for row in csv.DictReader(f)]


def _number(text: str):
  try:
    value = float(text)
  except ValueError:
    return text
  return int(value) if value.is_integer() and "." not in text and "e" not in text else value


# Columns of results.csv that are neither settings nor per-replica measures.
NOT_MEASURES = ("variant", "status", "error", *verdicts.COLUMNS, *provenance.FIELDS)


def read_csv(path) -> tuple[list[dict], verdicts.Design | None]:
  """The finished records as far as results.csv holds them (per variant its overrides, the
  columns between ``diverged_at`` and the first measure, every measure per replica and its
  provenance), and the design written with them (None in a CSV from before designs)."""
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    columns = reader.fieldnames
    table = list(reader)
  first_measure = next((i for i, c in enumerate(columns) if c in LEADING), None)
  if first_measure is None or "diverged_at" not in columns:
    raise ValueError(f"not a sweep's results.csv (no diverged_at or {' / '.join(LEADING)} "
                     "column).")
  settings = columns[columns.index("diverged_at") + 1:first_measure]
  records = {}
  for row in table:
    if row["status"] != "ok":
      continue
    record = records.setdefault(row["variant"], {
        "variant": row["variant"], "status": "ok", "metrics": {"name": []},
        "overrides": {k: _number(row[k]) for k in settings if row[k] != ""},
        "provenance": {k: row[k] for k in provenance.FIELDS if row.get(k)}})
    metrics = record["metrics"]
    metrics["name"].append(f"seed_{row['seed']}_{len(metrics['name'])}")
    for column in dict.fromkeys(columns):  # once each (older CSVs repeat a column)
      if column in (*NOT_MEASURES, *settings):
        continue
      value = row[column]
      if value == "" and column not in (verdicts.STEPS_TO, verdicts.VALIDATION_STEPS_TO):
        continue
      metrics.setdefault(column, []).append(math.nan if value == "" else _number(value))
  return list(records.values()), verdicts.Design.of_rows(table)


def records_from_csv(path) -> list[dict]:
  """The records of results.csv (read_csv without the design)."""
  return read_csv(path)[0]


def from_logs(records, workdir, design) -> list[dict]:
  """The records (copies) with what their replicas' metrics.jsonl adds per replica: the first
  evaluation at the design's threshold (NaN where never), on the test set and, where logged, on
  the validation stream (which chooses a time-to-threshold study's rates), and, where logged, the
  largest attention logit at the end and at its peak."""
  sign = 1.0 if design.higher_is_better else -1.0
  added = []
  for record in records:
    if record["status"] == "ok" and verdicts.STEPS_TO not in record["metrics"]:
      names, extra = record["metrics"]["name"], {}
      steps, values = logbook.curves(workdir, record, names, design.primary)
      extra[verdicts.STEPS_TO] = [
          statistics.first_step_reaching(steps, sign * row, sign * design.solved_at)
          for row in values]
      validation = f"{verdicts.VALIDATION}_{design.primary.rsplit('_', 1)[-1]}"
      if _has(workdir, record, validation):
        steps, values = logbook.curves(workdir, record, names, validation)
        extra[verdicts.VALIDATION_STEPS_TO] = [
            statistics.first_step_reaching(steps, sign * row, sign * design.solved_at)
            for row in values]
      if _has(workdir, record, MAX_LOGIT):
        _, logits = logbook.curves(workdir, record, names, MAX_LOGIT)
        extra[FINAL_LOGIT], extra[PEAK_LOGIT] = list(logits[:, -1]), list(logits.max(axis=1))
      record = {**record, "metrics": {**record["metrics"], **extra}}
    added.append(record)
  return added


def _logit_maxima(records) -> dict:
  """{arm label: (final, peak)} of the largest attention logit, means over seeds."""
  return {label: (float(np.mean(metrics[FINAL_LOGIT])), float(np.mean(metrics[PEAK_LOGIT])))
          for label, metrics, _ in report_tables.arm_values(records) if PEAK_LOGIT in metrics}


def report(records, design, directory, title, evaluations=(), workdir=None) -> dict:
  """comparisons.csv, results.md and the figures in ``directory``; with ``workdir`` (the
  sweep's, holding the replicas' metrics.jsonl) also learning curves and logit maxima. Returns
  the paths by kind."""
  finished = [r for r in records if r["status"] == "ok"]
  evaluations = tuple(e for e in evaluations if not e.startswith(verdicts.VALIDATION))
  measure = measure_of(records)
  chosen = verdicts.choose(records, measure, design)
  comparisons = verdicts.compare_both(chosen, design) if finished else []
  paths = {"comparisons": os.path.join(directory, "comparisons.csv"),
           "markdown": os.path.join(directory, "results.md")}
  write_comparisons(comparisons, paths["comparisons"])
  logged = workdir is not None and finished and PEAK_LOGIT in finished[0]["metrics"]
  with open(paths["markdown"], "w") as f:
    f.write(report_tables.markdown(title, records, design, comparisons, chosen,
                                   _logit_maxima(records)))
  if not finished:
    return paths
  paths["final"] = os.path.join(directory, "final_metrics.png")
  report_plots.plot_final(records, paths["final"], design)
  if any(f"final_{p}" in finished[0]["metrics"] for p in report_plots.PROBES_SHOWN):
    paths["probes"] = os.path.join(directory, "probes.png")
    report_plots.plot_probes(records, paths["probes"])
  if report_tables.varies_learning_rate(records):
    paths["learning_rates"] = os.path.join(directory, "learning_rates.png")
    for index, path in enumerate(report_plots.plot_learning_rates(records,
                                                                  paths["learning_rates"])):
      paths[f"learning_rates_{index + 1}" if index else "learning_rates"] = path
    paths["chosen"] = os.path.join(directory, "chosen_learning_rates.png")
    report_plots.plot_chosen(records, paths["chosen"], design)
  if evaluations:
    paths["lengths"] = os.path.join(directory, "accuracy_by_test_set.png")
    report_plots.plot_lengths(records, ("eval", *evaluations), paths["lengths"], design)
  if workdir is not None:
    paths["curves"] = os.path.join(directory, "learning_curves.png")
    report_plots.plot_curves(workdir, records, paths["curves"])
    if logged:
      paths["max_logits"] = os.path.join(directory, "max_attention_logits.png")
      report_plots.plot_max_logits(workdir, records, paths["max_logits"])
  return paths


def _has(workdir, record, metric) -> bool:
  try:
    steps, _ = logbook.curves(workdir, record, record["metrics"]["name"][:1], metric)
  except ValueError:  # no metrics.jsonl for the replica
    return False
  return len(steps) > 0


def write(records, workdir, design: verdicts.Design, evaluations=()) -> dict:
  """results.csv and the report of a sweep that trained in ``workdir``; ``evaluations``: the
  names of its extra test sets, in order. Returns the paths by kind."""
  records = from_logs(records, workdir, design)
  title = os.path.basename(os.path.normpath(workdir))
  csv_path = os.path.join(workdir, "results.csv")
  write_csv(records, csv_path, design)
  return {"csv": csv_path, **report(records, design, workdir, title, evaluations, workdir)}


def write_sweep(sweep, records, workdir) -> dict:
  """``write`` for the records of the sweep config ``sweep`` (its design and extra test sets)."""
  design = verdicts.Design.of_sweep(sweep, measure_of(records))
  return write(records, workdir, design, tuple(sweep.extra_evals))


def extra_evaluations(records) -> tuple[str, ...]:
  """The longer test sets of records read from a CSV, shortest first (the validation stream is
  not one of them: it chooses rates, the report does not plot it)."""
  names = report_tables.metric_names(records)
  lengths = sorted({m.removesuffix("_accuracy") for m in names
                    if re.fullmatch(r"length_\d+_\d+_accuracy", m)},
                   key=lambda name: int(name.split("_")[1]))
  return tuple(lengths)


def write_from_csv(csv_path) -> dict:
  """The report of a committed results.csv, beside it. Returns the paths by kind."""
  records, design = read_csv(csv_path)
  if not records:
    raise ValueError("no finished run in it.")
  if design is None:
    raise ValueError("it does not say what its study compares (no baseline column): run the "
                     "sweep's command again on its workdir (finished variants are not retrained), "
                     "or, for a committed study, python -m scripts.rereport.")
  directory = os.path.dirname(os.path.abspath(csv_path))
  return report(records, design, directory, os.path.basename(directory),
                extra_evaluations(records))


def merge_csv(paths, out_path) -> None:
  """One results.csv at ``out_path`` from the results.csv of sweeps that ran one design in parts
  (its learning rates split over several half-hour sweeps): every row as written, each with its
  own provenance. Refused where the parts declare different designs, write different columns,
  repeat a run (a variant, seed and learning rate twice) or leave a hole (a variant without a
  seed and rate that another has: a part not given)."""
  columns, table, designs, seen = None, [], set(), set()
  for path in paths:
    with open(path, newline="") as f:
      reader = csv.DictReader(f)
      part = list(reader)
    if columns is not None and reader.fieldnames != columns:
      raise ValueError(f"{path} writes other columns than {paths[0]} (different versions of the "
                       "sweep?): merge only the parts of one sweep config's mode at one commit.")
    columns = reader.fieldnames
    designs.add(verdicts.Design.of_rows(part))
    runs = {(r["variant"], r["seed"], r["learning_rate"]) for r in part if r["status"] == "ok"}
    if runs & seen:
      raise ValueError(f"{path} repeats runs of an earlier part, e.g. "
                       f"{sorted(runs & seen)[0]}; give each part once.")
    seen |= runs
    table += part
  if len(designs) != 1:
    raise ValueError("the parts declare different designs (arms, comparisons or test): merge "
                     "only the parts of one sweep config's mode.")
  cells = {(seed, rate) for _, seed, rate in seen}
  for variant in sorted({v for v, _, _ in seen}):
    missing = cells - {(s, r) for v, s, r in seen if v == variant}
    if missing:
      seed, rate = sorted(missing)[0]
      raise ValueError(f"{variant} has no run at seed {seed}, learning rate {rate} that another "
                       "variant has: give every part of the sweep.")
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, restval="")
    writer.writeheader()
    writer.writerows(table)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=write_from_csv.__doc__)
  parser.add_argument("--from_csv", required=True, nargs="+", help="results.csv files")
  parser.add_argument("--merge", default=None, help="write the parts given by --from_csv (one "
                      "design's learning rates run as several sweeps) as this one results.csv, "
                      "and its report beside it")
  args = parser.parse_args()
  if args.merge:
    try:
      merge_csv(args.from_csv, args.merge)
    except (OSError, ValueError, KeyError) as error:
      raise SystemExit(f"error: {args.merge}: {error}") from None
  for csv_path in [args.merge] if args.merge else args.from_csv:
    try:
      paths = write_from_csv(csv_path)
    except (OSError, ValueError, KeyError, StopIteration) as error:
      raise SystemExit(f"error: {csv_path}: {error}") from None
    for kind, path in paths.items():
      print(f"{kind}: {path}")
