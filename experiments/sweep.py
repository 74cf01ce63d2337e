"""Ablation sweeps: every variant of a sweep config, several seeds each, then tables and plots.

  python -m experiments.sweep --config=configs/ablations/heads.py --workdir=workdir/heads
  python -m experiments.sweep --config=configs/ablations/heads.py:quick --workdir=/tmp/heads
  python -m experiments.sweep --config=... --workdir=... --variants=heads_1,heads_4  # a subset

A sweep config (see configs/ablations/) holds ``train`` (a training config), ``variants`` (a tuple
of (name, overrides of ``train`` as a nested dict) pairs, run in that order), ``num_seeds``,
``vmap_seeds`` and ``extra_evals`` (name -> task-option overrides of an additional test set, e.g.
longer sequences). Each variant trains in
<workdir>/variants/<name>/ and leaves result.json there; a second run of the same command skips
the variants that finished and resumes the one that was interrupted from its checkpoint. A variant
that fails is recorded with its error and the sweep goes on. At the end <workdir> holds
results.csv, results.md and the plots (experiments/sweep_report.py).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback

from experiments import config_check
from experiments import seeds as seeds_lib


def variant_config(sweep, overrides):
  """The training config of one variant: ``sweep.train`` with ``overrides`` applied."""
  config = copy.deepcopy(sweep.train)
  config.unlock()
  config.update(overrides)
  return config


def check(sweep) -> None:
  """Raises ConfigError naming the variant when a variant's training config is invalid."""
  if sweep.num_seeds <= 0:
    raise config_check.ConfigError(f"num_seeds must be positive, got {sweep.num_seeds}.")
  names = [name for name, _ in sweep.variants]
  if not names or len(set(names)) != len(names):
    raise config_check.ConfigError(f"the sweep needs variants with distinct names, got {names}.")
  for name, overrides in sweep.variants:
    try:
      config_check.validate(variant_config(sweep, overrides))
    except (config_check.ConfigError, KeyError, TypeError) as error:
      raise config_check.ConfigError(f"variant '{name}': {error}") from None


def train_variant(sweep, config, directory: str) -> dict:
  """All seeds of one variant: one vmapped group, or (vmap_seeds=False) one group per seed."""
  extra_evals = {name: dict(options) for name, options in sweep.extra_evals.items()}
  if sweep.vmap_seeds:
    return seeds_lib.train_seeds(config, directory, sweep.num_seeds, extra_evals)
  merged = {}
  for index in range(sweep.num_seeds):
    alone = copy.deepcopy(config)
    alone.seed = config.seed + index
    result = seeds_lib.train_seeds(alone, os.path.join(directory, f"alone_{alone.seed}"), 1,
                                   extra_evals)
    for name, values in result.items():
      merged.setdefault(name, []).extend(values)
  merged["seconds"] = [sum(merged["seconds"])] * sweep.num_seeds  # the variant's wall time
  return merged


def _check_existing(sweep, name, config, directory) -> None:
  """A variant directory from an earlier run may be resumed or reused only if it was trained
  with the config the sweep asks for now (bookkeeping fields aside)."""
  changed = config_check.changed_fields(config, directory)
  result = os.path.join(directory, "result.json")
  if os.path.exists(result):
    with open(result) as f:
      record = json.load(f)
    if record["status"] == "ok":
      if len(record["metrics"]["seed"]) != sweep.num_seeds:
        changed.append("num_seeds")
      changed += [f"extra_evals.{extra}" for extra in sweep.extra_evals
                  if f"{extra}_accuracy" not in record["metrics"]]
  if changed:
    raise config_check.ConfigError(
        f"variant '{name}' in {directory} was trained with a different config "
        f"({', '.join(changed)} changed); use a new workdir, or delete that variant's directory "
        "to train it again.")


def run_sweep(sweep, workdir: str, only: list[str] | None = None) -> list[dict]:
  """Runs (or resumes) every variant, or those named in ``only``; returns one record per variant
  as saved in its result.json. Refuses (ConfigError), before training anything, to resume or
  reuse a variant directory that holds a different config."""
  check(sweep)
  unknown = sorted(set(only or ()) - {name for name, _ in sweep.variants})
  if unknown:
    raise config_check.ConfigError(f"no variants named {unknown}; this sweep has "
                                   f"{[name for name, _ in sweep.variants]}.")
  selected = [(name, overrides) for name, overrides in sweep.variants
              if not only or name in only]
  for name, overrides in selected:
    _check_existing(sweep, name, variant_config(sweep, overrides),
                    os.path.join(workdir, "variants", name))
  records = []
  for name, overrides in selected:
    directory = os.path.join(workdir, "variants", name)
    path = os.path.join(directory, "result.json")
    if os.path.exists(path):
      with open(path) as f:
        record = json.load(f)
      if record["status"] == "ok":
        print(f"[sweep] {name}: finished earlier, skipped", flush=True)
        records.append(record)
        continue
    config = variant_config(sweep, overrides)
    config_check.claim_workdir(config, directory)
    print(f"[sweep] {name}: training {sweep.num_seeds} seeds", flush=True)
    record = {"variant": name, "overrides": overrides}
    try:
      record.update(status="ok", metrics=train_variant(sweep, config, directory))
      print(f"[sweep] {name}: eval_accuracy {record['metrics']['eval_accuracy']}", flush=True)
    except Exception as error:  # noqa: BLE001 -- recorded; the other variants still run
      record.update(status="failed", error=f"{type(error).__name__}: {error}")
      with open(os.path.join(directory, "error.txt"), "w") as f:
        f.write(traceback.format_exc())
      print(f"[sweep] {name}: FAILED, {record['error']}", flush=True)
    with open(path, "w") as f:
      json.dump(record, f, indent=1)
    records.append(record)
  return records


def main():
  from absl import flags, logging
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "Path to a sweep config (configs/ablations/).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for the runs, tables and plots.", required=True)
  flags.DEFINE_list("variants", None, "Run only these variants (default: all).")

  def run(argv):
    del argv
    logging.set_verbosity(logging.ERROR)  # TFDS warns about every custom task config
    from experiments import sweep_report  # matplotlib only here
    workdir = flags.FLAGS.workdir
    try:
      records = run_sweep(flags.FLAGS.config, workdir, flags.FLAGS.variants)
    except config_check.ConfigError as error:
      sys.exit(f"config error: {error}")
    paths = sweep_report.write(records, workdir)
    with open(paths["markdown"]) as f:
      print(f.read())
    print("[sweep] wrote " + ", ".join(sorted(paths.values())))
    failed = [record["variant"] for record in records if record["status"] != "ok"]
    if failed:
      sys.exit(f"[sweep] {len(failed)} variant(s) failed: {failed}; see "
               f"{workdir}/variants/<name>/error.txt and run the same command again to retry.")

  config_check.run_app(run)


if __name__ == "__main__":
  main()
