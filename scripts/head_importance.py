"""Which heads carry a trained sweep's answer: head importance (Michel et al. 2019) per variant.

  python scripts/head_importance.py --sweep=workdir/ablations/heads_binding/multi_retrieval \
      --out=docs/results/heads_binding/importance

For every variant of the sweep (or those given with --variants), every seed at the variant's
chosen learning rate (the one the sweep's report chose on its validation stream) is restored
and each head of each layer is switched off in turn (experiments/probe_reports.py): its importance is
the NMSE it adds on the test set (or the accuracy it costs). A head is "essential" when its
importance is at least --threshold. Writes importance.md (per variant: the essential heads and
the share of the importance held by the top --top heads, with 95% intervals over the seeds) and
importance.png (each variant's importances in decreasing order).
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
