"""Per-head diagnostics of a trained model on its test data: a table, heat maps, attention maps.

  python scripts/head_diagnostics.py --workdir=workdir/ablations/heads/variants/heads_4

For every head of every layer (experiments/probe_reports.py, write_head_diagnostics): the softmax
entropy, the mean attention distance |t - s|, the fraction of queries whose own key has the
largest logit (the "diagonal fallacy"), and the head's importance, the drop in test accuracy when
that head alone is switched off. Writes head_diagnostics.md, head_diagnostics.png and
attention_maps/ into --out (default: the workdir).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probe_reports  # noqa: E402


def main():
  print(probe_reports.command_line(
      __doc__, lambda args: probe_reports.write_head_diagnostics(
          args.workdir, args.replica, args.examples, args.maps, args.out),
      source="workdir", workdir=dict(required=True, help="a training run or a sweep variant"),
      replica=dict(type=int, default=0,
                   help="which replica (seed x hyperparameters) of the run, by index"),
      examples=dict(type=int, default=512, help="test examples for statistics"),
      maps=dict(type=int, default=2, help="examples to draw attention maps for")))


if __name__ == "__main__":
  main()
