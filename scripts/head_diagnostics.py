"""Per-head diagnostics of a trained model on its test data: a table, heat maps, attention maps.

  python scripts/head_diagnostics.py --workdir=workdir/ablations/heads/variants/heads_4

For every head of every layer: the softmax entropy, the mean attention distance |t - s|, the
fraction of queries whose own key has the largest logit (the "diagonal fallacy"), and the head's
importance, the drop in test accuracy when that head alone is switched off. Writes
head_diagnostics.md, head_diagnostics.png and attention_maps/ into --out (default: the workdir).
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import attention_maps, figures, probes, trained  # noqa: E402

COLUMNS = ("entropy", "distance", "diagonal_max", "importance")


def diagnose(run: trained.Trained, num_examples: int) -> dict:
  """{name: [L, N]} on the first ``num_examples`` test examples (importance: the whole split)."""
  tokens = run.task.test.tokens[:num_examples]
  stats = jax.device_get(probes.head_statistics(run.model, run.params, tokens))
  stats["importance"] = probes.head_importance(run.model, run.params, run.task.test, run.config,
                                               run.task.num_classes)
  return {name: np.asarray(stats[name]) for name in COLUMNS}


def table(stats) -> str:
  lines = ["| layer | head | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
  layers, heads = stats["entropy"].shape
  for layer in range(layers):
    for head in range(heads):
      lines.append(f"| {layer} | {head} | " + " | ".join(
          f"{stats[name][layer, head]:.3f}" for name in COLUMNS) + " |")
  return "\n".join(lines) + "\n"


def heat_maps(stats, path: str) -> None:
  figure, axes = plt.subplots(1, len(COLUMNS), figsize=(min(figures.WIDTH, 3 * len(COLUMNS)), 2.8),
                              squeeze=False)
  for axis, name in zip(axes[0], COLUMNS):
    values = stats[name]
    image = axis.imshow(values, cmap="magma", aspect="auto")
    layers, heads = values.shape
    axis.set_xticks(range(heads))
    axis.set_yticks(range(layers))
    for layer in range(layers):
      for head in range(heads):
        axis.text(head, layer, f"{values[layer, head]:.2f}", ha="center", va="center",
                  fontsize=figures.SMALLEST, color="gray")
    axis.set_title(name)
    axis.set_xlabel("head")
    axis.set_ylabel("layer")
    figure.colorbar(image, ax=axis)
  figure.tight_layout()
  figures.save(figure, path, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="a training run or a sweep variant")
  parser.add_argument("--replica", type=int, default=0,
                      help="which replica (seed x hyperparameters) of the run, by index")
  parser.add_argument("--examples", type=int, default=512, help="test examples for statistics")
  parser.add_argument("--maps", type=int, default=2, help="examples to draw attention maps for")
  parser.add_argument("--out", default=None, help="output directory (default: the workdir)")
  args = parser.parse_args()
  out = args.out or args.workdir
  os.makedirs(out, exist_ok=True)
  run = trained.load(args.workdir, args.replica)
  stats = diagnose(run, args.examples)
  text = (f"Heads of {args.workdir} (step {run.step}, replica {run.replica['name']}), "
          f"{run.task.name} test data\n\n" + table(stats))
  with open(os.path.join(out, "head_diagnostics.md"), "w") as f:
    f.write(text)
  heat_maps(stats, os.path.join(out, "head_diagnostics.png"))
  attention_maps.write(run.model, run.params, run.task, args.maps,
                       os.path.join(out, "attention_maps"))
  print(text)


if __name__ == "__main__":
  main()
