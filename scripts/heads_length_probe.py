"""Which head retrieves which maximum? The trained models of configs/ablations/heads_length.py,
probed on held-out examples.

  python scripts/heads_length_probe.py --sweep=workdir/ablations/heads_length \
      --out=docs/results/heads_length

Each arm with h >= D - 1 heads at its learning rate chosen on the validation stream, each seed:
experiments.probes.max_shares on the first 500 test examples, the maxima matched to distinct
heads (probes.matched). Writes probe.md (each maximum's matched share, and the seeds in which
every maximum is retrieved) and probe.png (experiments.probe_reports.write_max_shares).

Prediction L4 (the config's predictions, fixed with the sweep's before it ran): at h = D every
maximum has its own head at every length (probe_reports.every_maximum_its_head).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs.ablations.heads_length import D, LENGTHS, name  # noqa: E402
from experiments import probe_reports  # noqa: E402


def main():
  print(probe_reports.command_line(__doc__, lambda args: probe_reports.write_max_shares(
      args.sweep, args.out, D, [name(D, t) for t in LENGTHS])))


if __name__ == "__main__":
  main()
