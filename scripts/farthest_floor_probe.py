"""Does the one head find the farthest point, and where is the answer lost? The trained models of
configs/ablations/farthest_floor.py, probed on held-out examples (after the run, descriptive).

  python scripts/farthest_floor_probe.py --sweep=workdir/ablations/farthest_floor \
      --out=docs/results/farthest_floor

For each one-head arm at its learning rate chosen on the validation stream, and each seed, on the
first NUM_EXAMPLES test examples: ``found``, the share of tokens whose most-attended point is
their farthest one (experiments/tasks/farthest_point.farthest); ``weight``, the mean attention
weight on it; and ``readable``, the NMSE of the best linear read-out of the target from the
attention layer's input plus its output at that token (least squares over these examples; the
residual stream right after the attention, before its LayerNorm): how much of the answer the
stream carries at all. Writes probe.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import probes, statistics, sweep_report, trained, verdicts  # noqa: E402
from experiments import workdir as workdir_lib  # noqa: E402
from experiments.tasks import farthest_point  # noqa: E402

NUM_EXAMPLES = 500


def measures(run) -> dict[str, float]:
  """found, weight and readable (the module's docstring) of one trained replica."""
  x = np.asarray(run.task.test.tokens[:NUM_EXAMPLES])  # [B, T, d]
  target = np.asarray(run.task.test.labels[:NUM_EXAMPLES], np.float64)  # [B, T, d]
  _, weights, _ = probes.capture(run.model, run.params, x)
  attention = np.asarray(weights[0])[:, 0]  # the one head of the one layer: [B, T, T]
  far = farthest_point.farthest(x)  # [B, T]
  on_far = np.take_along_axis(attention, far[..., None], axis=-1)[..., 0]  # [B, T]
  stream = np.asarray(stream_after_attention(run, x), np.float64)  # [B, T, D]
  features = np.concatenate([stream, np.ones(stream.shape[:-1] + (1,))], -1).reshape(
      -1, stream.shape[-1] + 1)
  flat = target.reshape(-1, target.shape[-1])
  fitted, *_ = np.linalg.lstsq(features, flat, rcond=None)
  readable = np.mean((features @ fitted - flat) ** 2) / np.mean(np.var(flat, axis=0))
  return {"found": float(np.mean(attention.argmax(-1) == far)), "weight": float(np.mean(on_far)),
          "readable": float(readable)}


def stream_after_attention(run, x):
  """x [B, T, d] -> the first block's input plus its attention output, [B, T, D]."""
  _, state = run.model.apply({"params": run.params}, x, mutable="intermediates",
                             capture_intermediates=lambda module, _: module.name in (
                                 "embed", "attention"))
  encoder = state["intermediates"]["encoder"]
  embedded = encoder["embed"]["__call__"][0]
  return embedded + encoder["block_0"]["attention"]["__call__"][0]


def probe(sweep: str) -> dict[str, list[dict[str, float]]]:
  """{arm: [measures per seed]} for every one-head arm."""
  records = sweep_report.records_from_csv(os.path.join(sweep, "results.csv"))
  chosen = verdicts.choose(records, sweep_report.measure_of(records))
  return {c.variant: [measures(run) for run in trained.at_rate(
              os.path.join(sweep, "variants", c.variant), c.learning_rate)]
          for c in chosen
          if workdir_lib.flatten(c.record["overrides"])["model.num_heads"] == 1}


def table(results) -> str:
  lines = ["| arm | farthest point most attended | attention weight on it | "
           "NMSE of the best linear read-out after the attention |", "|---|---|---|---|"]
  for arm, per_seed in results.items():
    cells = []
    for name, upper in (("found", 1.0), ("weight", 1.0), ("readable", np.inf)):
      mean, low, high = statistics.mean_interval([m[name] for m in per_seed], 0.0, upper)
      cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
    lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="the sweep's workdir (results.csv, variants/)")
  parser.add_argument("--out", default=None, help="output directory (default: the sweep's)")
  args = parser.parse_args()
  text = table(probe(args.sweep))
  with open(os.path.join(args.out or args.sweep, "probe.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
