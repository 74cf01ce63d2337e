"""Redoes every committed study's report from its results.csv: comparisons.csv, results.md and
the figures, with the statistics engine of experiments/statistics.py, in under a minute.

  python -m scripts.rereport            # every study in STUDIES
  python -m scripts.rereport heads_binding scaling/accelerator  # these studies (folders)

and the comparisons of the superseded runs kept beside a study (COMPARISONS_ONLY).

A results.csv written before sweeps recorded their design and provenance gets them first, once:
the design from the study's config (where the comparisons are declared; for these studies that
declaration came after their run, which their pages say), the provenance from its results page
(PAGES), "not recorded" where the page has none. Where the config declares a time-to-solve
test and the CSV holds no steps per seed (its workdir is gone), the solve rate is tested.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import provenance, sweep_report, verdicts  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "results")
# results.csv (under docs/results/) -> (config module under configs.ablations, its mode)
STUDIES = {
    "heads/results.csv": ("heads", None),
    "scaling/results.csv": ("scaling", None),
    "scaling/accelerator/results.csv": ("scaling", "accelerator"),
    "scaling_init/results.csv": ("scaling_init", None),
    "head_variants/mqar/results.csv": ("head_variants", "mqar"),
    "head_variants/order_4/results.csv": ("head_variants", "order_4"),
    "head_variants/order_16/results.csv": ("head_variants", "order_16"),
    "heads_length/results.csv": ("heads_length", None),
    "heads_binding/multi_retrieval/results.csv": ("heads_binding", "multi_retrieval"),
    "heads_binding/multi_retrieval_10seeds/results.csv": ("heads_binding", "multi_retrieval"),
    "heads_binding/farthest_point/results.csv": ("heads_binding", "farthest_point"),
    "heads_binding/farthest_point_10seeds/results.csv": ("heads_binding", "farthest_point"),
    "heads_binding/multi_retrieval_accelerator/results.csv": (
        "heads_binding", "multi_retrieval_accelerator"),
    "attention_variants/results.csv": ("attention_variants", None),
    "attention_variants/controls/results.csv": ("attention_variants", "controls"),
    "positional/results.csv": ("positional", None),
    "positional_registered/results.csv": ("positional_registered", None),
    "positional_causal/order/results.csv": ("positional_causal", "order"),
    "positional_causal/even_pairs/results.csv": ("positional_causal", "even_pairs"),
    "positional_causal/randomized/results.csv": ("positional_causal", "randomized"),
    "farthest_floor/results.csv": ("farthest_floor", None),
    "heads_width/d32/results.csv": ("heads_width", "d32"),
    "heads_width/d64/results.csv": ("heads_width", "d64"),
    "heads_width/d64_T64_h2/results.csv": ("heads_width", "d64_T64_h2"),
    "heads_width/d64_T64_h4/results.csv": ("heads_width", "d64_T64_h4"),
    "heads_width/d128_T8/results.csv": ("heads_width", "d128_T8"),
    "heads_width/d128_T32_h2/results.csv": ("heads_width", "d128_T32_h2"),
    "heads_width/d128_T32_h4/results.csv": ("heads_width", "d128_T32_h4"),
    "scale_optimiser/adam_dk16/results.csv": ("scale_optimiser", "adam_dk16"),
    "scale_optimiser/adam_dk64/results.csv": ("scale_optimiser", "adam_dk64"),
    "scale_optimiser/sgd_dk16/results.csv": ("scale_optimiser", "sgd_dk16"),
    "scale_optimiser/mup_dk16/results.csv": ("scale_optimiser", "mup_dk16"),
    "scale_optimiser/mup_dk64/results.csv": ("scale_optimiser", "mup_dk64"),
    "scale_optimiser/mup_dk256/results.csv": ("scale_optimiser", "mup_dk256"),
    "scale_optimiser/sgd_unscaled_dk16/results.csv": ("scale_optimiser", "sgd_unscaled_dk16"),
    "scale_optimiser/sgd_unscaled_dk64/results.csv": ("scale_optimiser", "sgd_unscaled_dk64"),
    "scale_optimiser/sgd_pilot_inv_sqrt/results.csv": ("scale_optimiser", "sgd_dk16"),
    "scale_optimiser/sgd_pilot_none/results.csv": ("scale_optimiser", "sgd_dk16"),
    "scale_optimiser/sgd_pilot_high/results.csv": ("scale_optimiser", "sgd_dk16"),
    "heads_width/farthest_point/results.csv": ("heads_width", "farthest_point"),
}
# A superseded run's rows kept beside a study -> its comparisons.csv (no report, no figures)
COMPARISONS_ONLY = {
    "head_variants/order_all_arms.csv": "head_variants/order_all_arms_comparisons.csv",
}
_CPU_EPYC, _CPU_XEON = "AMD EPYC, 2 cores", "Intel Xeon, 2 cores"
_H200 = "1 x NVIDIA H200"
_OLD = {"python": "3.11 (patch not recorded)", "jax": "0.10.2", "flax": "0.12.8",
        "optax": "0.2.8"}
# The provenance that the results pages give for CSVs from before runs recorded it.
PAGES = {
    "scaling/accelerator/results.csv": {"commit": "2e6a9bf", "python": "3.12.3", "jax": "0.11.2",
                                        "flax": "0.12.10", "optax": "0.2.8", "machine": _H200,
                                        "date": "2026-11-26"},
    "heads_binding/multi_retrieval/results.csv": {
        "commit": "381534f", **_OLD, "python": "3.11.7", "machine": _CPU_EPYC,
        "date": "2026-11-25"},
    "heads_binding/farthest_point/results.csv": {
        "commit": "310dd5a", **_OLD, "python": "3.11.7", "machine": _CPU_EPYC,
        "date": "2026-11-25"},
    "heads_binding/multi_retrieval_accelerator/results.csv": {
        "commit": "f111ad4", "python": "3.12.3", "jax": "0.11.2", "flax": "0.12.10",
        "optax": "0.2.8", "machine": _H200, "date": "2026-11-26"},
    "attention_variants/results.csv": {"commit": "92e3314", **_OLD, "python": "3.11.7",
                                       "machine": _CPU_EPYC, "date": "2026-11-25"},
    "positional/results.csv": {"commit": "not recorded (results committed in 07309f0)", **_OLD,
                               "machine": _CPU_XEON, "date": "2026-11-23"},
}


def add_design(path: str, relative: str) -> bool:
  """Writes the study's design and the page's provenance into a results.csv that lacks them;
  False when it has them already."""
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    columns, table = reader.fieldnames, list(reader)
  if "baseline" in columns:
    return False
  module, mode = STUDIES[relative]
  config = importlib.import_module(f"configs.ablations.{module}")
  swept = config.get_config(mode) if mode else config.get_config()
  records, _ = sweep_report.read_csv(path)
  design = verdicts.Design.of_sweep(swept, sweep_report.measure_of(records))
  if design.test == "time_to_solve" and verdicts.STEPS_TO not in columns:
    # The run logged no steps-to-threshold per seed, and its workdir is gone: the solve rate.
    design = dataclasses.replace(design, test="solve_rate")
  known = {field: PAGES.get(relative, {}).get(field, "not recorded")
           for field in provenance.FIELDS}
  for row in table:
    row.update(design.columns(row["variant"]), **known)
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, list(columns) + list(verdicts.COLUMNS) + list(provenance.FIELDS))
    writer.writeheader()
    writer.writerows(table)
  return True


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("only", nargs="*", help="redo only these studies: folders under "
                      "docs/results/, e.g. heads_binding or scaling/accelerator")
  args = parser.parse_args()
  for relative in STUDIES:
    folder = os.path.dirname(relative)
    if args.only and not any(folder == part.strip("/") or folder.startswith(part.strip("/") + "/")
                             for part in args.only):
      continue
    path = os.path.join(RESULTS, relative)
    if add_design(path, relative):
      print(f"{relative}: design and provenance added")
    paths = sweep_report.write_from_csv(path)
    print(f"{relative}: " + ", ".join(os.path.relpath(p, RESULTS) for p in paths.values()))
  for relative, out in COMPARISONS_ONLY.items():
    if args.only and not any(relative == part or relative.startswith(part.strip("/") + "/")
                             for part in args.only):
      continue
    records, design = sweep_report.read_csv(os.path.join(RESULTS, relative))
    chosen = verdicts.choose(records, sweep_report.measure_of(records), design)
    sweep_report.write_comparisons(verdicts.compare_both(chosen, design),
                                   os.path.join(RESULTS, out))
    print(f"{relative}: {out}")


if __name__ == "__main__":
  main()
