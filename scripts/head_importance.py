"""Which heads carry a trained sweep's answer: head importance (Michel et al. 2019) per variant.

  python scripts/head_importance.py --sweep=workdir/ablations/heads_binding/multi_retrieval \
      --out=docs/results/heads_binding/importance

Every seed of each variant (or of --variants) at its chosen learning rate, each head switched
off in turn (experiments.probes.head_importance). Writes importance.md and importance.png
(experiments.probe_reports.write_head_importance).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probe_reports  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="a sweep's workdir (results.csv, variants/)")
  parser.add_argument("--variants", default=None,
                      help="comma-separated variants (default: every variant with > 1 head)")
  parser.add_argument("--threshold", type=float, default=0.05,
                      help="importance at which a head counts as essential (NMSE or accuracy)")
  parser.add_argument("--top", type=int, default=None,
                      help="the share of the top this many heads (default: the task's "
                           "num_retrievals, else 1)")
  parser.add_argument("--out", default=None, help="output directory (default: the sweep's)")
  args = parser.parse_args()
  print(probe_reports.write_head_importance(
      args.sweep, args.out or args.sweep, args.variants.split(",") if args.variants else None,
      args.threshold, args.top))


if __name__ == "__main__":
  main()
