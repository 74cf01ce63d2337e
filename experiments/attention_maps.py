"""Attention maps: every head of every layer for a few test examples, tokens on the axes."""

from __future__ import annotations

import os

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attention_jax as aj  # noqa: E402
from experiments import figures, probes  # noqa: E402


def attention_weights(model, params, tokens):
  """Per-layer weights [L][B, N, T', T'] captured from the model's "intermediates"."""
  return probes.capture(model, params, tokens)[1]


def write(model, params, task, num_examples: int, directory: str) -> list[str]:
  """One PNG per example: a grid of layers x heads. Returns the paths."""
  os.makedirs(directory, exist_ok=True)
  tokens = task.test.tokens[:num_examples]  # [B, T] ids, or [B, T, F] vectors
  weights = jax.device_get(attention_weights(model, params, tokens))
  valid = np.asarray(aj.encoder.inputs_to_valid(tokens, model.config))  # [B, T]
  offset = weights[0].shape[-1] - valid.shape[1]  # 1 with a CLS token
  paths = []
  for example in range(len(tokens)):
    length = int(np.sum(valid[example])) + offset
    names = (task.token_names[:length - offset] if task.input_features  # positions
             else [task.token_names[t] for t in tokens[example][:length - offset]])
    labels = (["CLS"] if offset else []) + list(names)
    layers, heads = len(weights), weights[0].shape[1]
    columns = min(2, layers * heads)  # two maps to a row: tokens legible at page width
    rows = -(-layers * heads // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(figures.WIDTH, 3.3 * rows + 0.6),
                                squeeze=False)
    every = -(-length // 24)  # at most 24 token labels per axis
    for index, axis in enumerate(axes.flat):
      if index >= layers * heads:
        axis.axis("off")
        continue
      layer, head = divmod(index, heads)
      image = axis.imshow(weights[layer][example, head, :length, :length], cmap="viridis",
                          vmin=0.0, vmax=1.0)
      axis.set_title(f"layer {layer} head {head}", fontsize=9)
      ticks = range(0, length, every)
      axis.set_xticks(ticks, [labels[t] for t in ticks], fontsize=figures.SMALLEST, rotation=90)
      axis.set_yticks(ticks, [labels[t] for t in ticks], fontsize=figures.SMALLEST)
      axis.set_xlabel("key (attended to)", fontsize=figures.SMALLEST)
      axis.set_ylabel("query (attending)", fontsize=figures.SMALLEST)
    label = "" if task.regression else f", label {task.test.labels[example]}"
    figure.suptitle(f"{task.name} test example {example}{label}")
    figure.tight_layout()
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8, pad=0.02)  # one scale: [0, 1]
    colorbar.set_label("attention weight (each row sums to 1)", fontsize=figures.SMALLEST)
    path = os.path.join(directory, f"example_{example}.png")
    figures.save(figure, path, dpi=120)
    paths.append(path)
  return paths
