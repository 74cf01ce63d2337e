"""Probes of a trained run or sweep, after the run (descriptive): every seed of an arm at the
learning rate its report chose on the validation stream, probed (experiments/probes.py), and the
tables and plots of what the probes found. The command lines (``command_line``):
scripts/head_importance.py, scripts/farthest_floor_probe.py, scripts/heads_length_probe.py,
scripts/head_diagnostics.py, and the patching studies'.

  head importance (Michel et al. 2019)   write_head_importance   importance.md, importance.png
  the farthest-point probe               write_farthest_point    probe.md
  which head retrieves which maximum     write_max_shares        probe.md, probe.png
  each head of one run                   write_head_diagnostics  head_diagnostics.md, .png
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import os

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import (attention_maps, figures, probes, report_plots, report_tables,  # noqa: E402
                         statistics, sweep_report, trained, verdicts)
from experiments import workdir as workdir_lib  # noqa: E402

NUM_EXAMPLES = 500  # test examples the farthest-point and max-share probes read
RETRIEVED = 0.8  # the matched share at which a maximum counts as retrieved by its head


def chosen_rates(records) -> dict[str, float]:
  """{variant: learning rate} as the sweep's report chose them."""
  return {c.variant: c.learning_rate
          for c in verdicts.choose(records, sweep_report.measure_of(records))}


def _records(sweep: str) -> list[dict]:
  return sweep_report.records_from_csv(os.path.join(sweep, "results.csv"))


def per_arm(sweep: str, measure, heads) -> dict[str, list]:
  """{arm: [measure(run) per seed]} for every arm of ``sweep`` (a workdir with results.csv and
  variants/) whose model.num_heads satisfies ``heads``, each at its chosen learning rate."""
  records = _records(sweep)
  return {c.variant: [measure(run) for run in trained.at_rate(
              os.path.join(sweep, "variants", c.variant), c.learning_rate)]
          for c in verdicts.choose(records, sweep_report.measure_of(records))
          if heads(workdir_lib.flatten(c.record["overrides"])["model.num_heads"])}


def _table(first: str, headers: list[str], rows: list[list[str]]) -> str:
  """A markdown table, as the reports write them (report_tables.split_table)."""
  return "\n".join(report_tables.split_table(first, headers, rows)) + "\n"


def _cell(values, lower=-np.inf, upper=np.inf, digits: int = 2) -> str:
  mean, low, high = statistics.mean_interval(values, lower, upper)
  return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


# Head importance.

def variant_importances(variant_dir: str, learning_rate: float) -> list[np.ndarray]:
  """[L, N] importance of every seed trained at ``learning_rate`` in one variant's workdir."""
  return [probes.head_importance(run.model, run.params, run.task.test, run.config,
                                 run.task.num_classes)
          for run in trained.at_rate(variant_dir, learning_rate)]


def importance_table(results: dict, threshold: float, top: int) -> str:
  """results: {variant: [importance [L, N] per seed]} -> a markdown table: the essential heads
  (importance >= ``threshold``), the share of the ``top`` heads and the largest importance,
  means with 95% intervals over the seeds."""
  rows = []
  for variant, importances in results.items():
    essential = [probes.essential_heads(i, threshold) for i in importances]
    shares = [probes.top_share(i, top) for i in importances]
    rows.append([variant, str(importances[0].size), str(len(importances)),
                 _cell(essential, 0, importances[0].size), _cell(shares, 0, 1),
                 _cell([float(np.max(i)) for i in importances])])
  return _table("variant", ["heads", "seeds", f"essential heads (>= {threshold:g})",
                            f"share of the top {top}", "largest importance"], rows)


def importance_plot(results: dict, path: str, measure: str) -> None:
  """Each variant's importances in decreasing order, the mean over seeds with its interval."""
  figure, axis = plt.subplots(figsize=(6.4, 3.6))
  for variant, importances in results.items():
    ranked = np.sort(np.stack([i.ravel() for i in importances]), axis=1)[:, ::-1]  # [seeds, L N]
    means, errors = report_plots.yerr(ranked.T, "importance")  # one seed: no interval
    axis.errorbar(np.arange(1, ranked.shape[1] + 1), means, yerr=errors, marker="o",
                  markersize=3, capsize=2, label=variant)
  axis.set_xscale("log", base=2)
  ranks = [2 ** k for k in range(max(len(i[0].ravel()) for i in results.values()).bit_length())]
  axis.set_xticks(ranks, [str(rank) for rank in ranks])
  axis.set_xlabel("head, by importance (1 = the most important)")
  axis.set_ylabel(f"{measure} when switched off")
  axis.axhline(0.0, color="gray", linewidth=0.5)
  axis.legend(fontsize=figures.SMALLEST)
  figure.tight_layout()
  figures.save(figure, path, dpi=110)


def write_head_importance(sweep: str, out: str, variants: list[str] | None = None,
                          threshold: float = 0.05, top: int | None = None) -> str:
  """Head importance of every seed of ``variants`` (default: every variant with more than one
  head) at its chosen learning rate; writes importance.md and importance.png to ``out`` and
  returns the markdown. ``top`` defaults to the task's num_retrievals, else 1."""
  records = _records(sweep)
  rates = chosen_rates(records)
  root = os.path.join(sweep, "variants")
  names = variants or sorted(rates)
  results = {}
  for name in names:
    if name not in rates:
      raise SystemExit(f"error: variant {name!r} has no result in {sweep}/results.csv; "
                       f"choose from {sorted(rates)}.")
    importances = variant_importances(os.path.join(root, name), rates[name])
    if variants or importances[0].size > 1:
      results[name] = importances
  with open(os.path.join(root, names[0], "config.json")) as f:
    top = top or json.load(f)["task_options"].get("num_retrievals", 1)
  measure = {"nmse": "NMSE added", "accuracy": "accuracy lost"}[sweep_report.measure_of(records)]
  os.makedirs(out, exist_ok=True)
  text = (f"Head importance in {sweep} ({measure} when one head is switched off, on the "
          f"test set), at each variant's chosen learning rate; means with 95% intervals over "
          f"the seeds.\n\n" + importance_table(results, threshold, top))
  with open(os.path.join(out, "importance.md"), "w") as f:
    f.write(text)
  importance_plot(results, os.path.join(out, "importance.png"), measure)
  return text


# The farthest-point probe.

def farthest_point_table(results: dict[str, list[dict[str, float]]]) -> str:
  """results: {arm: [probes.farthest_point_found per seed]} -> a markdown table."""
  return _table("arm", ["farthest point most attended", "attention weight on it",
                        "NMSE of the best linear read-out after the attention"],
                [[f"`{arm}`"] + [_cell([m[name] for m in per_seed], 0.0, upper, digits=3)
                                 for name, upper in (("found", 1.0), ("weight", 1.0),
                                                     ("readable", np.inf))]
                 for arm, per_seed in results.items()])


def write_farthest_point(sweep: str, out: str) -> str:
  """probes.farthest_point_found for every one-head arm of ``sweep``, each seed, on
  NUM_EXAMPLES test examples; writes probe.md to ``out`` and returns it."""
  text = farthest_point_table(per_arm(
      sweep, lambda run: probes.farthest_point_found(run, NUM_EXAMPLES), lambda n: n == 1))
  with open(os.path.join(out, "probe.md"), "w") as f:
    f.write(text)
  return text


# Which head retrieves which maximum.

def max_share_table(results: dict[str, list[np.ndarray]]) -> str:
  """results: {arm: [share [N, D] per seed]} -> per arm, each maximum's matched share over the
  seeds and the seeds in which every maximum is retrieved (matched share >= RETRIEVED)."""
  maxima = next(iter(results.values()))[0].shape[1]
  rows = []
  for arm, per_seed in results.items():
    best = np.array([probes.matched(s) for s in per_seed])  # [seeds, D]
    every = int(np.sum(np.all(best >= RETRIEVED, axis=1)))
    rows.append([arm, *(_cell(best[:, i], 0.0, 1.0) for i in range(maxima)),
                 f"{every} of {len(best)}"])
  return _table("arm", [f"max {i + 1}" for i in range(maxima)]
                + [f"seeds with every maximum retrieved (>= {RETRIEVED:g})"], rows)


def every_maximum_its_head(results: dict[str, list[np.ndarray]], arms: list[str]
                           ) -> tuple[bool, str]:
  """Whether, in each of ``arms``, each maximum's matched share is at least RETRIEVED, the lower
  end of its 95% interval over the seeds included; (held, the lowest lower end and where)."""
  maxima = results[arms[0]][0].shape[1]
  lows = {(arm, i): statistics.mean_interval([probes.matched(s)[i] for s in results[arm]],
                                             0.0, 1.0)[1]
          for arm in arms for i in range(maxima)}
  (arm, i), low = min(lows.items(), key=lambda item: item[1])
  return low >= RETRIEVED, f"lowest interval end {low:.2f} (maximum {i + 1} of {arm})"


def max_share_plot(results: dict[str, list[np.ndarray]], arms: list[str], path: str) -> None:
  """share[j, i] of seed 0 of each of ``arms`` (as many heads as maxima, one per length)."""
  arms = [arm for arm in arms if arm in results]
  width = min(figures.WIDTH, 3.0 * len(arms) + 1.0)
  figure, axes = plt.subplots(1, len(arms), figsize=(width, 3.0),
                              squeeze=False, sharey=True, layout="constrained")
  for k, (axis, arm) in enumerate(zip(axes[0], arms)):
    share = results[arm][0]
    heads, maxima = share.shape
    image = axis.imshow(share, vmin=0, vmax=1, cmap="viridis")
    axis.set_title(f"{heads} heads, T = {arm.split('_T')[1]} (seed 0)", fontsize=9)
    axis.set_xlabel("maximum i")
    axis.set_xticks(range(maxima), [str(i + 1) for i in range(maxima)])
    axis.set_yticks(range(heads), [str(j + 1) for j in range(heads)])
    if k == 0:
      axis.set_ylabel("head j")
  figure.colorbar(image, ax=axes[0].tolist(), shrink=0.9,
                  label="share: head j's top token\nis the argmax of maximum i")
  figures.save(figure, path, dpi=110, bbox_inches="tight")


def write_max_shares(sweep: str, out: str, maxima: int, full_arms: list[str]) -> str:
  """probes.max_shares for every arm of ``sweep`` with at least ``maxima`` - 1 heads, each seed,
  on NUM_EXAMPLES test examples, and whether every maximum has its own head in ``full_arms``
  (the arms with as many heads as maxima); writes probe.md and probe.png to ``out`` and returns
  the markdown."""
  results = per_arm(sweep, lambda run: probes.max_shares(run, NUM_EXAMPLES),
                    lambda n: n >= maxima - 1)
  os.makedirs(out, exist_ok=True)
  held, measured = every_maximum_its_head(results, full_arms)
  text = (f"Matched share of each maximum (mean over seeds, 95% bootstrap interval), on "
          f"{NUM_EXAMPLES} test examples, each arm at its chosen learning rate.\n\n"
          f"{max_share_table(results)}\nL4 (every maximum its own head at h = {maxima}, every "
          f"length): **{'held' if held else 'not held'}**, {measured}.\n")
  with open(os.path.join(out, "probe.md"), "w") as f:
    f.write(text)
  max_share_plot(results, full_arms, os.path.join(out, "probe.png"))
  return text


# Each head of one run.

#: The per-head measures of write_head_diagnostics, as probes.head_statistics names them.
HEAD_MEASURES = ("entropy", "distance", "diagonal_max", "importance")


def head_diagnostics(run: trained.Trained, num_examples: int) -> dict[str, np.ndarray]:
  """{measure: [L, N]} on the first ``num_examples`` test examples (importance: the whole
  split)."""
  stats = jax.device_get(probes.head_statistics(run.model, run.params,
                                                run.task.test.tokens[:num_examples]))
  stats["importance"] = probes.head_importance(run.model, run.params, run.task.test, run.config,
                                               run.task.num_classes)
  return {name: np.asarray(stats[name]) for name in HEAD_MEASURES}


def head_table(stats: dict[str, np.ndarray]) -> str:
  """A markdown table: a row per (layer, head), a column per measure."""
  layers, heads = stats[HEAD_MEASURES[0]].shape
  rows = [[str(layer), str(head), *(f"{stats[name][layer, head]:.3f}" for name in HEAD_MEASURES)]
          for layer in range(layers) for head in range(heads)]
  return _table("layer", ["head", *HEAD_MEASURES], rows)


def write_head_diagnostics(workdir: str, replica: int, num_examples: int, num_maps: int,
                           out: str) -> str:
  """head_diagnostics of ``replica`` of the run in ``workdir``: writes head_diagnostics.md (the
  table), head_diagnostics.png (a heat map per measure) and attention_maps/ (``num_maps`` test
  examples) to ``out``, and returns the markdown."""
  run = trained.load(workdir, replica)
  stats = head_diagnostics(run, num_examples)
  os.makedirs(out, exist_ok=True)
  text = (f"Heads of {workdir} (step {run.step}, replica {run.replica['name']}), "
          f"{run.task.name} test data\n\n" + head_table(stats))
  with open(os.path.join(out, "head_diagnostics.md"), "w") as f:
    f.write(text)
  report_plots.per_head_maps(stats, os.path.join(out, "head_diagnostics.png"))
  attention_maps.write(run.model, run.params, run.task, num_maps,
                       os.path.join(out, "attention_maps"))
  return text


def command_line(doc: str, write: Callable[[argparse.Namespace], object], source: str = "sweep",
                 argv: list[str] | None = None, **flags: dict):
  """A probe's command line: ``--{source}`` (the trained sweep's or run's workdir), ``--out``
  (default: that workdir) and a ``--name`` per ``flags`` ({name: argparse's keywords}, which may
  also redefine the first two); returns ``write(arguments)``, and ends with an expected failure
  (no such workdir, nothing to probe) as one line.

  >>> command_line("A probe.", lambda a: (a.sweep, a.out, a.top), argv=["--sweep=runs/s"],
  ...              top=dict(type=int, default=1, help="heads counted"))
  ('runs/s', 'runs/s', 1)
  """
  parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  flags = {source: dict(required=True, help=f"the {source}'s workdir (results.csv, variants/)"),
           "out": dict(default=None, help=f"output directory (default: the {source}'s)")} | flags
  for name, keywords in flags.items():
    parser.add_argument(f"--{name}", **keywords)
  arguments = parser.parse_args(argv)
  arguments.out = arguments.out or getattr(arguments, source)
  try:
    return write(arguments)
  except (ValueError, FileNotFoundError) as error:
    raise SystemExit(f"{parser.prog}: {error}") from None
