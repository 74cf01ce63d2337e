"""Looking inside a classifier: attention statistics per head, gradients reaching W_Q and W_K,
head importance (the accuracy lost, or the NMSE gained, when one head is switched off at
evaluation), and what the heads of the farthest-point and multi-retrieval models find
(experiments/probe_reports.py runs these over a trained sweep).

The statistics are those the arguments about attention are made of: the variance of the logits
the softmax sees, the softmax entropy and largest weight, the mean attention distance, how
often a query's own key has the largest logit (the "diagonal fallacy"), the weight on the first
token (an attention sink: Xiao et al. 2023; Qiu et al. 2025), and the largest activation of the
residual stream (massive activations: Sun et al. 2024).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

import attention_jax as aj
from attention_jax import hooks
from experiments import input_pipeline
from experiments import steps as steps_lib
from experiments.tasks import farthest_point, multi_retrieval

STATISTICS = ("logit_variance", "entropy", "max_weight", "distance", "negative_weight",
              "diagonal_max", "first_token_weight")


def capture(model, params, tokens, with_activations=False):
  """Per-layer logits and weights [L][B, N, T', T'] and the valid pairs [B, 1, T', T'] (and with
  ``with_activations``, the largest |activation| of any block's output at a valid token), read
  at the hook points (attention_jax.hooks): each layer's attn.hook_attn_scores and
  attn.hook_pattern, and its hook_resid_post."""
  layers = range(model.config.num_layers)
  maps = [[f"blocks.{layer}.attn.{hook}" for layer in layers]
          for hook in ("hook_attn_scores", "hook_pattern")]
  outputs = [f"blocks.{layer}.hook_resid_post" for layer in layers] if with_activations else []
  _, values = hooks.capture(model, {"params": params}, tokens, maps[0] + maps[1] + outputs)
  logits, weights = ([values[name] for name in names] for names in maps)
  valid = aj.encoder.inputs_to_valid(tokens, model.config)  # [B, T]
  extra = logits[0].shape[-1] - valid.shape[-1]  # 1 with a CLS token
  valid = jnp.concatenate([jnp.ones(valid.shape[:-1] + (extra,), bool), valid], axis=-1)
  pairs = (valid[:, :, None] & valid[:, None, :])[:, None]  # [B, 1, T', T']
  if not with_activations:
    return logits, weights, pairs
  largest = jnp.max(jnp.stack([jnp.max(jnp.where(valid[..., None], jnp.abs(values[name]), 0.0))
                               for name in outputs]))  # over blocks, tokens and features
  return logits, weights, pairs, largest


def max_attention_logit(model, params, tokens):
  """The largest attention logit over layers, heads and valid (query, key) pairs of a batch: the
  quantity Wortsman et al. (2023) watch, seeing runs diverge once it passes about 1e4."""
  logits, _, pairs = capture(model, params, tokens)
  return jnp.max(jnp.stack([jnp.max(jnp.where(pairs, l, -jnp.inf)) for l in logits]))


def head_statistics(model, params, tokens) -> dict:
  """Each statistic per layer and head, {name: [L, N]}, and max_activation (a scalar)."""
  logits, weights, pairs, largest = capture(model, params, tokens, with_activations=True)
  per_layer = [aj.diagnostics.head_statistics(l, w, pairs) for l, w in zip(logits, weights)]
  return {**{name: jnp.stack([layer[name] for layer in per_layer]) for name in STATISTICS},
          "max_activation": largest}


def _projection_grad_norm(grads, name):
  leaves = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(grads)
            if any(getattr(entry, "key", None) == name for entry in path)]
  return jnp.sqrt(sum(jnp.sum(leaf ** 2) for leaf in leaves))


def summary(model, params, tokens, labels, num_classes) -> dict:
  """Scalars for a sweep's table: each statistic averaged over layers and heads, the largest
  activation, and the norms of the loss gradient reaching the query and key projections (all
  layers), on one batch."""
  def loss_fn(params):
    return steps_lib.objective(model.apply({"params": params}, tokens), labels, num_classes)[0]
  grads = jax.grad(loss_fn)(params)
  stats = {name: jnp.mean(value) for name, value in head_statistics(model, params, tokens).items()}
  return {**stats, "query_grad_norm": _projection_grad_norm(grads, "query"),
          "key_grad_norm": _projection_grad_norm(grads, "key")}


def without_head(params, layer: int, head: int):
  """Parameters with head ``head`` of layer ``layer`` switched off: its rows of W_O set to zero,
  so Concat(head_1..head_N) W_O no longer sees it."""
  attention = params["encoder"][f"block_{layer}"]["attention"]
  kernel = attention["out"]["kernel"].at[head].set(0.0)  # [N, H, D]
  attention = {**attention, "out": {**attention["out"], "kernel": kernel}}
  block = {**params["encoder"][f"block_{layer}"], "attention": attention}
  return {**params, "encoder": {**params["encoder"], f"block_{layer}": block}}


def head_importance(model, params, split, config, num_classes) -> np.ndarray:
  """What each head alone costs when switched off, [L, N] on ``split`` (config: the run's): the
  accuracy lost, or for real targets the NMSE gained."""
  eval_fn = jax.jit(lambda p, batch: steps_lib.eval_step(
      p, batch, model=model, compute_dtype=jnp.dtype(config.compute_dtype),
      num_classes=num_classes))
  def accuracy(p):  # or minus the NMSE: higher is better either way
    metrics = steps_lib.evaluate(eval_fn, p, input_pipeline.eval_batches(split, config.batch_size))
    return metrics["eval_accuracy"] if "eval_accuracy" in metrics else -metrics["eval_nmse"]
  baseline = accuracy(params)
  return np.array([[baseline - accuracy(without_head(params, layer, head))
                    for head in range(model.config.num_heads)]
                   for layer in range(model.config.num_layers)])


def essential_heads(importance, threshold: float) -> int:
  """How many heads (over all layers) cost at least ``threshold`` when switched off alone."""
  return int(np.sum(np.asarray(importance) >= threshold))


def top_share(importance, top: int) -> float:
  """The share of the total positive importance held by the ``top`` most important heads."""
  positive = np.sort(np.clip(np.asarray(importance).ravel(), 0.0, None))[::-1]
  total = positive.sum()
  return float(positive[:top].sum() / total) if total > 0 else float("nan")


def farthest_point_found(run, num_examples: int) -> dict[str, float]:
  """What the one head of a one-layer farthest_point model does on the first ``num_examples``
  test examples of ``run`` (an experiments.trained.Trained): ``found``, the share of tokens whose
  most-attended point is their farthest one (farthest_point.farthest); ``weight``, the mean
  attention weight on it; ``readable``, the NMSE of the best linear read-out of the target from
  the stream right after the attention (stream_after_attention; least squares over these
  examples): how much of the answer the stream carries at all."""
  x = np.asarray(run.task.test.tokens[:num_examples])  # [B, T, d]
  target = np.asarray(run.task.test.labels[:num_examples], np.float64)  # [B, T, d]
  _, weights, _ = capture(run.model, run.params, x)
  attention = np.asarray(weights[0])[:, 0]  # the one head of the one layer: [B, T, T]
  far = farthest_point.farthest(x)  # [B, T]
  on_far = np.take_along_axis(attention, far[..., None], axis=-1)[..., 0]  # [B, T]
  stream = np.asarray(stream_after_attention(run.model, run.params, x), np.float64)  # [B, T, D]
  features = np.concatenate([stream, np.ones(stream.shape[:-1] + (1,))], -1).reshape(
      -1, stream.shape[-1] + 1)
  flat = target.reshape(-1, target.shape[-1])
  fitted, *_ = np.linalg.lstsq(features, flat, rcond=None)
  readable = np.mean((features @ fitted - flat) ** 2) / np.mean(np.var(flat, axis=0))
  return {"found": float(np.mean(attention.argmax(-1) == far)), "weight": float(np.mean(on_far)),
          "readable": float(readable)}


def stream_after_attention(model, params, x):
  """x [B, T, d] -> the first block's input plus its attention output (the residual stream right
  after the attention, before its LayerNorm), [B, T, D]."""
  names = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out"]
  _, values = hooks.capture(model, {"params": params}, x, names)
  return values[names[0]] + values[names[1]]


def max_shares(run, num_examples: int) -> np.ndarray:
  """share[j, i] of a multi_retrieval model (``run``: an experiments.trained.Trained): how often
  head j's read-out query (the CLS token) attends most to the token that attains maximum i,
  argmax_s <w_i, x_s>, on the first ``num_examples`` test examples; [N, D]."""
  x = np.asarray(run.task.test.tokens[:num_examples])  # [B, T, F]
  _, weights, _ = capture(run.model, run.params, x)
  read_out = np.asarray(weights[0])[:, :, 0, 1:]  # the CLS query over the T vectors: [B, N, T]
  attended = read_out.argmax(-1)  # [B, N]
  options = run.config.task_options
  w, _, _ = multi_retrieval.function(options.get("directions_seed", 0), options.num_retrievals,
                                     options.length, options.features)
  argmax = np.einsum("btf,df->btd", x, w).argmax(1)  # [B, D]
  return (attended[:, :, None] == argmax[:, None, :]).mean(0)  # [N, D]


def matched(share: np.ndarray) -> np.ndarray:
  """Each maximum's share [N, D] under the assignment of distinct heads that maximises their sum
  (scipy.optimize.linear_sum_assignment): [D], 0 for a maximum left without a head when there
  are fewer heads than maxima."""
  heads, maxima = optimize.linear_sum_assignment(share, maximize=True)
  out = np.zeros(share.shape[1])
  out[maxima] = share[heads, maxima]
  return out
