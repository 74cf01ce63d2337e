"""Which head retrieves which maximum? The trained models of configs/ablations/heads_length.py,
probed on held-out examples.

  python scripts/heads_length_probe.py --sweep=workdir/ablations/heads_length \
      --out=docs/results/heads_length

For each arm with h >= D - 1 heads, at its learning rate chosen on the validation stream, and each
seed: on the first 500 examples of the test set (experiments/probe_reports.py), the token each
head's read-out query (the CLS token) attends to most, against the token that attains each
maximum, argmax_s <w_i, x_s>. share[j, i] is the fraction of examples on which they coincide. The D
maxima are matched to distinct heads by the assignment that maximises the summed share
(scipy.optimize.linear_sum_assignment); a maximum is "retrieved" when its head's share is at least
0.8. Writes probe.md (per arm: the matched share of each maximum, means with 95% intervals
over seeds, and the seeds in which every maximum is retrieved) and probe.png (share[j, i] of seed
0 for h = D at each length).

Prediction (L4, fixed with the sweep's before it ran): at h = D every maximum has its own head,
at every length: each maximum's matched share has a mean of at least 0.8 over the seeds,
the lower end of its 95% bootstrap interval included (an interval, not a test: 6 seeds cannot
pass a sign test after Holm over the lengths).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations.heads_length import D, LENGTHS, name  # noqa: E402
from experiments import probe_reports  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="the sweep's workdir (results.csv, variants/)")
  parser.add_argument("--out", default=None, help="output directory (default: the sweep's)")
  args = parser.parse_args()
  print(probe_reports.write_max_shares(args.sweep, args.out or args.sweep, D,
                                       [name(D, t) for t in LENGTHS]))


if __name__ == "__main__":
  main()
