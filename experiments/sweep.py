"""Ablation sweeps: every variant of a sweep config, several seeds each, then tables and plots.

  python -m experiments.sweep --config=configs/ablations/heads.py --workdir=workdir/heads
  python -m experiments.sweep --config=configs/ablations/heads.py:quick --workdir=workdir/quick
  python -m experiments.sweep --config=... --workdir=... --variants=heads_1,heads_4  # a subset

A sweep config (see configs/ablations/) holds ``train`` (a training config), ``variants`` (a tuple
of (name, overrides of ``train`` as a nested dict) pairs, run in that order), ``num_seeds``,
``grid`` (hyperparameter -> values, e.g. {"learning_rate": (1e-3, 3e-3)}; may be empty),
``vmap_replicas``, ``replicas_per_program`` (0: all of a variant's replicas in one program) and
``extra_evals`` (name -> task-option overrides of an additional test set,
e.g. longer sequences), and the study's design: ``baseline``, ``contrasts``, ``test``,
``primary`` (experiments/verdicts.py), ``bracket`` and ``budget_minutes`` (``bracket`` below). A
variant's replicas are its seeds times the grid; with vmap_replicas they train as one compiled,
vmapped program (experiments/train.py), else one after the other. Before training, the sweep
prints whether its seeds can reach p < 0.05 after Holm with its test, and refuses, in one line
naming the seeds it needs, a study that declares ``alpha`` (every full study does; a quick smoke
test does not) and cannot reach it: neither with its comparisons nor, where the sweep names its
``predictions`` ("configs/ablations/<study>.py:<mode>", experiments/findings.py), with their
tested checks.

Each variant trains in <workdir>/variants/<name>/ and leaves result.json there; a second run of
the same command skips the variants that finished and resumes the one that was interrupted from
its checkpoint. A variant that fails is recorded with its error and the sweep goes on (a full
disk, a busy workdir and SIGTERM/SIGINT stop the sweep instead, as they stop a run). At the end
<workdir> holds results.csv, results.md and the plots (experiments/sweep_report.py).

With --distributed (docs/guides/many_hosts.md) every process trains every variant together;
whether a variant failed is agreed by all of them, and one process writes the records and
reports.
"""

from __future__ import annotations

if __name__ == "__main__":  # before jax is imported; experiments/launch.py says why
  from experiments import launch
  launch.with_huge_pages()

import copy
import dataclasses
import os
import sys
import traceback

from experiments import cli
from experiments import config_check
from experiments import findings
from experiments import hosts
from experiments import interrupts
from experiments import provenance
from experiments import replicas as replicas_lib
from experiments import report_tables
from experiments import steps as steps_lib
from experiments import train as train_lib
from experiments import verdicts
from experiments import workdir as workdir_lib


def say(*args) -> None:
  """Prints on the process that writes (all of them agree on what happens)."""
  if hosts.writer():
    print(*args)


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
  replicas_lib.replicas_of(sweep.train, sweep.num_seeds, grid(sweep))  # a bad grid is refused here
  try:
    verdicts.Design.of_sweep(sweep, "accuracy")
  except ValueError as error:
    raise config_check.ConfigError(f"sweep.test: {error}") from None
  if not isinstance(sweep.get("bracket", 0), int) or sweep.get("bracket", 0) < 0:
    raise config_check.ConfigError(f"sweep.bracket must be a count >= 0 of learning rates to add "
                                   f"past each edge of the grid, got {sweep.get('bracket')!r}.")
  if sweep.get("baseline") is not None and sweep.baseline not in names:
    raise config_check.ConfigError(f"sweep.baseline must name one of the variants {names}, got "
                                   f"{sweep.get('baseline')!r}.")
  for arm, reference in verdicts.comparisons(sweep):
    if arm not in names or reference not in names:
      raise config_check.ConfigError(
          f"sweep.contrasts pairs {arm!r} with {reference!r}, but the variants are {names}.")
  for name, overrides in sweep.variants:
    try:
      config_check.validate(variant_config(sweep, overrides))
    except (config_check.ConfigError, KeyError, TypeError) as error:
      raise config_check.ConfigError(f"variant '{name}': {error}") from None


def grid(sweep) -> dict:
  return {name: tuple(values) for name, values in sweep.get("grid", {}).items()}


def program_size(sweep) -> int:
  """Replicas per compiled program: 0 for all of a variant's, 1 with vmap_replicas=False."""
  return sweep.get("replicas_per_program", 0) if sweep.vmap_replicas else 1


def train_variant(sweep, config, directory: str, grid_=None) -> dict:
  """All replicas (seeds x grid, or ``grid_``) of one variant: one vmapped program, or programs of
  ``replicas_per_program`` replicas each (in <directory>/programs/<first>-<last>/; one replica
  per program with vmap_replicas=False, in <directory>/alone/<replica>). Returns lists over
  replicas, in the order of ``replicas_of``."""
  extra_evals = {name: dict(options) for name, options in sweep.extra_evals.items()}
  grid_ = grid(sweep) if grid_ is None else grid_
  replicas = replicas_lib.replicas_of(config, sweep.num_seeds, grid_)
  size = program_size(sweep)
  if not 0 < size < len(replicas):
    return train_lib.train(config, directory, replicas, extra_evals=extra_evals, probes=True)
  merged, wall = {}, 0.0
  for start in range(0, len(replicas), size):
    program = replicas[start:start + size]
    fixed = copy.deepcopy(config)
    if size == 1:  # the run a user would start by hand: seed and grid values in its config
      fixed.update({name: type(config[name])(program[0][name]) for name in ("seed", *grid_)})
      where = os.path.join(directory, "alone", program[0]["name"])
    else:
      where = os.path.join(directory, "programs", f"{start}-{start + len(program) - 1}")
    result = train_lib.train(fixed, where, program, extra_evals=extra_evals, probes=True)
    wall += result["seconds"][0]
    for name, values in result.items():
      merged.setdefault(name, []).extend(values)
  merged["seconds"] = [wall] * len(replicas)  # the variant's wall time
  return merged


def _check_existing(sweep, name, config, directory) -> None:
  """A variant directory from an earlier run may be resumed or reused only if it was trained
  with the config the sweep asks for now (bookkeeping fields aside)."""
  changed = workdir_lib.changed_fields(config, directory)
  names = [r["name"] for r in replicas_lib.replicas_of(config, sweep.num_seeds, grid(sweep))]
  record = workdir_lib.read_result(directory)
  finished = record is not None and record["status"] == "ok"
  before = workdir_lib.replica_names(directory)  # None unless started (maybe interrupted)
  if before is None:
    before = record["metrics"].get("name") if finished else names
  if before != names:
    changed.append("num_seeds or grid")
  if finished:
    changed += [f"extra_evals.{extra}" for extra in sweep.extra_evals
                if f"{extra}_loss" not in record["metrics"]]
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
  hosts.agree(lambda: [_check_existing(sweep, name, variant_config(sweep, overrides),
                                       os.path.join(workdir, "variants", name))
                        for name, overrides in selected])
  design = verdicts.Design.of_sweep(sweep, "accuracy")
  names = {name for name, _ in selected}  # the comparisons this run's report can make
  say("[sweep] " + verdicts.power_note(dataclasses.replace(design, comparisons=tuple(
      pair for pair in design.comparisons if set(pair) <= names)), sweep.num_seeds))
  refusal = design.refusal(sweep.num_seeds)
  if refusal is None and sweep.get("alpha") is not None and sweep.get("predictions"):
    refusal = findings.refusal(findings.declaration_of(sweep.predictions), sweep.num_seeds)
  if refusal:
    raise config_check.ConfigError(f"the study's design is underpowered: {refusal}")
  spent = [0.0]  # seconds of training so far, against sweep.budget_minutes
  with workdir_lib.owned(workdir):
    return [_run_variant(sweep, name, overrides, os.path.join(workdir, "variants", name), spent)
            for name, overrides in selected]


def _run_variant(sweep, name, overrides, directory, spent) -> dict:
  """The record of one variant: trained now, or as it finished earlier; its learning-rate grid
  extended where sweep.bracket asks (bracket)."""
  config = variant_config(sweep, overrides)
  record = hosts.agree(workdir_lib.read_result, directory)
  if record is not None and record["status"] == "ok":
    say(f"[sweep] {name}: finished earlier, skipped")
  else:
    record = _train_record(sweep, name, overrides, config, directory)
  if record["status"] == "ok":
    spent[0] += record["metrics"]["seconds"][0]
    record = bracket(sweep, config, directory, record, spent)
  return record


def bracket(sweep, config, directory, record, spent) -> dict:
  """With ``sweep.bracket`` = k > 0, while the learning rate the validation stream chooses sits
  at an edge of the grid, trains the seeds at the next rate past that edge (the ratio between the
  edge and its neighbour) in <directory>/bracket/<rate>/, up to k rates per edge and
  within ``sweep.budget_minutes`` of training for the whole sweep. Returns the record with those
  replicas added (and rewritten to result.json); unchanged when bracketed already."""
  rates = sorted(set(record["metrics"]["learning_rate"]))
  if not sweep.get("bracket") or len(rates) < 2:
    return record
  declared = grid(sweep)["learning_rate"]
  measure = report_tables.measure_of([record])
  design = verdicts.Design.of_sweep(sweep, measure)
  sweep_dir = os.path.dirname(os.path.dirname(directory))  # <workdir>/variants/<name>
  while True:
    # the rate chosen for the outcome the study measures (a time-to-threshold study: the
    # validation stream's time, from the replicas' logs), as the report will choose it
    from experiments import sweep_report  # pylint: disable=import-outside-toplevel (matplotlib)
    scored = sweep_report.from_logs([record], sweep_dir, design) if (
        design.test == "time_to_solve") else [record]
    (chosen,) = verdicts.choose(scored, measure, design)
    rates = sorted(set(record["metrics"]["learning_rate"]))
    added = {"lowest": sum(r < min(declared) for r in rates),
             "highest": sum(r > max(declared) for r in rates)}
    if not chosen.edge or added[chosen.edge] >= sweep.bracket:
      return record
    new = (rates[0] ** 2 / rates[1] if chosen.edge == "lowest" else rates[-1] ** 2 / rates[-2])
    per_rate = record["metrics"]["seconds"][0] / len(declared)  # the grid trains as one program
    budget = 60 * sweep.get("budget_minutes", 30)
    if spent[0] + per_rate > budget:
      say(f"[sweep] {record['variant']}: learning rate {chosen.learning_rate:g} is the "
          f"{chosen.edge} of the grid; no time left to try {new:.3g} (budget "
          f"{budget / 60:g} minutes)")
      return record
    say(f"[sweep] {record['variant']}: learning rate {chosen.learning_rate:g} is the "
        f"{chosen.edge} of the grid; training {new:.3g} to bracket it")
    extension = os.path.join(directory, "bracket", f"{new:.3g}")
    hosts.agree(lambda: workdir_lib.claim(config, extension) if hosts.writer() else None)
    metrics = hosts.agree(train_variant, sweep, config, extension,
                          {"learning_rate": (float(f"{new:.3g}"),)})
    spent[0] += metrics["seconds"][0]
    record = {**record, "metrics": {name: list(values) + list(metrics.get(name, []))
                                    for name, values in record["metrics"].items()},
              "provenance": provenance.summary([record.get("provenance", {}),
                                                provenance.collect()])}
    if hosts.writer():
      workdir_lib.write_result(directory, record)


def _train_record(sweep, name, overrides, config, directory) -> dict:
  hosts.agree(lambda: workdir_lib.claim(config, directory) if hosts.writer() else None)
  count = len(replicas_lib.replicas_of(config, sweep.num_seeds, grid(sweep)))
  size = program_size(sweep)
  apart = f", {size} per program" if 0 < size < count else ""
  say(f"[sweep] {name}: training {count} replicas (seeds x grid{apart})")
  record = {"variant": name, "overrides": overrides, "provenance": provenance.collect()}
  try:
    record.update(status="ok", metrics=hosts.agree(train_variant, sweep, config, directory))
    say(f"[sweep] {name}: " + ", ".join(f"eval_{m} {record['metrics'][f'eval_{m}']}"
                                        for m in steps_lib.MEASURES
                                        if f"eval_{m}" in record["metrics"]))
  except (workdir_lib.WorkdirError, interrupts.Interrupted):
    raise  # the sweep cannot go on either; the same command resumes it
  except Exception as error:  # noqa: BLE001 -- recorded; the other variants still run
    record.update(status="failed", error=f"{type(error).__name__}: {error}")
    if hosts.writer():
      with workdir_lib.writing(directory):
        workdir_lib.write_atomically(os.path.join(directory, "error.txt"),
                                     traceback.format_exc())
    say(f"[sweep] {name}: FAILED, {record['error']}")
  if hosts.writer():
    workdir_lib.write_result(directory, record)
  return record


def main():
  from absl import flags, logging
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "Path to a sweep config (configs/ablations/).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for the runs, tables and plots.", required=True)
  flags.DEFINE_list("variants", None, "Run only these variants (default: all).")
  hosts.define_flags(flags)

  def run(argv):
    del argv
    logging.set_verbosity(logging.ERROR)  # TFDS warns about every custom task config
    from experiments import sweep_report  # matplotlib only here
    workdir = flags.FLAGS.workdir
    records = []
    cli.run_command(lambda: (hosts.initialize_from(flags.FLAGS), records.extend(
        run_sweep(flags.FLAGS.config, workdir, flags.FLAGS.variants))))
    if hosts.writer():
      paths = sweep_report.write_sweep(flags.FLAGS.config, records, workdir)
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
