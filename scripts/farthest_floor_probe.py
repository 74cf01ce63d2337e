"""Does the one head find the farthest point, and where is the answer lost? The trained models of
configs/ablations/farthest_floor.py, probed on held-out examples (after the run, descriptive).

  python scripts/farthest_floor_probe.py --sweep=workdir/ablations/farthest_floor \
      --out=docs/results/farthest_floor

Each one-head arm at its learning rate chosen on the validation stream, each seed:
experiments.probes.farthest_point_found (found, weight, readable) on the first 500 test
examples. Writes probe.md (experiments.probe_reports.write_farthest_point).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probe_reports  # noqa: E402


def main():
  print(probe_reports.command_line(
      __doc__, lambda args: probe_reports.write_farthest_point(args.sweep, args.out)))


if __name__ == "__main__":
  main()
