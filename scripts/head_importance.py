"""Which heads carry a trained sweep's answer: head importance (Michel et al. 2019) per variant.

  python scripts/head_importance.py --sweep=workdir/ablations/heads_binding/multi_retrieval \
      --out=docs/results/heads_binding/importance

Every seed of each variant (or of --variants) at its chosen learning rate, each head switched
off in turn (experiments.probes.head_importance). Writes importance.md and importance.png
(experiments.probe_reports.write_head_importance).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probe_reports  # noqa: E402


def main():
  print(probe_reports.command_line(
      __doc__, lambda args: probe_reports.write_head_importance(
          args.sweep, args.out, args.variants.split(",") if args.variants else None,
          args.threshold, args.top),
      variants=dict(default=None,
                    help="comma-separated variants (default: every variant with > 1 head)"),
      threshold=dict(type=float, default=0.05,
                     help="importance at which a head counts as essential (NMSE or accuracy)"),
      top=dict(type=int, default=None, help="the share of the top this many heads (default: "
                                             "the task's num_retrievals, else 1)")))


if __name__ == "__main__":
  main()
