"""Hand-set parameters that solve the regression tasks through the library's own encoder, so a
model that fails to learn a task is never one that cannot express it.

Each oracle takes a model (a post-LN ``attention_jax`` Sequence- or TokenClassifier, any number of
layers and heads, config.input_features set) and its initial parameters, and returns parameters of
the same tree in which the first block's attention does the work and everything else passes it on:

- the inputs are embedded in orthonormal directions with mean 0 over the d_model coordinates (so
  LayerNorm, which subtracts the mean and divides by the norm, acts on them as a scalar), and the
  attention writes its answer in directions of its own, apart from those of the inputs;
- every other weight is 0 and every LayerNorm scale 1, so later sublayers and blocks add nothing
  and LayerNorm's rescaling is undone by the read-out;
- where the norm of the residual stream would vary with the data, a large constant ``offset``
  direction (the embedding's bias, or the CLS vector) makes it nearly constant, so LayerNorm is
  linear up to a relative error of about |data|^2 / (2 offset^2).

The constructions need room in the residual stream: farthest_point 2 d + 1 dimensions,
multi_retrieval F + D + 3, sparse_average 2 (d' + T) + 2 (checked).
"""

from __future__ import annotations

import jax
import numpy as np

from experiments import tasks
from experiments.tasks import multi_retrieval as multi_retrieval_task


def basis(d_model: int, count: int) -> np.ndarray:
  """``count`` orthonormal vectors of R^d_model, each with mean 0: [count, D]."""
  if count > d_model - 1:
    raise ValueError(f"the oracle needs d_model >= {count + 1}, got {d_model}; widen the model.")
  columns = np.concatenate([np.ones((d_model, 1)), np.eye(d_model)[:, :count]], axis=1)
  q, _ = np.linalg.qr(columns)  # column 0 spans the ones; the rest are orthogonal to it
  return q[:, 1:].T


def _passing_on(params):
  """A writable copy of ``params`` with every leaf 0 but LayerNorm scales 1."""
  def leaf(path, value):
    is_scale = getattr(path[-1], "key", None) == "scale"
    return np.full(value.shape, 1.0 if is_scale else 0.0, np.float32)
  return jax.tree_util.tree_map_with_path(leaf, jax.device_get(params))


def _check(model):
  config = model.config
  if config.pre_layer_norm or config.input_features is None or config.head_variant != "mha":
    raise ValueError("the oracles set a post-LN encoder with vector inputs and plain multi-head "
                     "attention; use pre_layer_norm=False, input_features and head_variant='mha'.")
  return config


def _heads(params):
  """The first block's attention parameters, and the logit scale 1/sqrt(d_k) it applies."""
  attention = params["encoder"]["block_0"]["attention"]
  return attention, 1.0 / np.sqrt(attention["query"]["kernel"].shape[-1])


def farthest_point(model, params, beta: float = 1e4):
  """Amsel et al.'s one full-rank head: q = beta x_s, k = -x_t, v = x_t, so head 0 returns the
  point of smallest <x_s, x_t>, the farthest; d_k must be >= d."""
  config = _check(model)
  d, width = config.input_features, config.d_model
  params = _passing_on(params)
  inputs, answers = np.split(basis(width, 2 * d), 2)  # [d, D] each
  params["encoder"]["embed"]["kernel"][:] = inputs
  attention, scale = _heads(params)
  attention["query"]["kernel"][:, 0, :d] = beta / scale * inputs.T
  attention["key"]["kernel"][:, 0, :d] = -inputs.T
  attention["value"]["kernel"][:, 0, :d] = inputs.T
  attention["out"]["kernel"][0, :d] = answers
  # LN(x_s in inputs + x_far in answers), a stream of norm sqrt(2): times sqrt(D / 2)
  params["logits"]["kernel"][:] = answers.T * np.sqrt(2.0 / width)
  return params


def multi_retrieval(model, params, task_options: dict, beta: float = 1e3, offset: float = 1e3):
  """Yu et al.'s construction: head i (of D) reads the CLS token's constant query against keys
  <w_i, x_s> and returns the value <w_i, x_s> of the maximiser; the CLS token's own key is -10
  (a flag direction), so it is never picked. Needs num_heads >= D."""
  config = _check(model)
  options = {**tasks.task_options("multi_retrieval"), **task_options}
  w, mu, sigma = multi_retrieval_task.function(*(  # [D, F], [D], [D]
      options[name] for name in ("directions_seed", "num_retrievals", "length", "features")))
  count, features, width = len(w), config.input_features, config.d_model
  if config.num_heads < count:
    raise ValueError(f"the oracle uses a head per retrieval: num_heads >= {count}.")
  params = _passing_on(params)
  directions = basis(width, features + 2 + count)
  inputs, flag, big, answers = np.split(directions, [features, features + 1, features + 2])
  params["encoder"]["embed"]["kernel"][:] = inputs
  params["encoder"]["cls"][:] = offset * big[0] + flag[0]
  attention, scale = _heads(params)
  attention["query"]["bias"][:count, 0] = beta / scale
  attention["key"]["kernel"][:, :count, 0] = inputs.T @ w.T - 10.0 * flag[0][:, None]
  attention["value"]["kernel"][:, :count, 0] = inputs.T @ w.T
  attention["out"]["kernel"][:count, 0] = answers
  # LN(offset big + flag + sum_i a_i u_i) ~ (...) sqrt(D) / offset; y_i = (a_i - mu_i) / sigma_i
  params["logits"]["kernel"][:] = answers.T * offset / np.sqrt(width) / sigma
  params["logits"]["bias"][:] = -mu / sigma
  return params


def solution(task: str, model, params, task_options: dict, beta: float | None = None):
  """The oracle of ``task`` (ORACLES) applied to ``model``'s parameter tree ``params`` (arrays or
  shapes: only the tree and the shapes are read), with its own ``beta`` unless one is given."""
  sharpness = {} if beta is None else {"beta": beta}
  if task == "farthest_point":
    return farthest_point(model, params, **sharpness)
  return ORACLES[task](model, params, task_options, **sharpness)


def sparse_average(model, params, task_options: dict, beta: float = 40.0, offset: float = 1e3):
  """Sanford et al.'s one head: q = beta 1_{S_s}, k = e_t, v = z_t, so head 0 spreads its weight
  evenly over the q named positions; d_k must be >= max(T, d')."""
  config = _check(model)
  options = {**tasks.task_options("sparse_average"), **task_options}
  length, value_dim = options["length"], options["value_dim"]
  width = config.d_model
  params = _passing_on(params)
  directions = basis(width, 2 * value_dim + 2 * length + 1)
  z, selected, position, answers, big = np.split(directions, np.cumsum(
      [value_dim, length, length, value_dim]))
  params["encoder"]["embed"]["kernel"][:] = np.concatenate([z, selected, position])
  params["encoder"]["embed"]["bias"][:] = offset * big[0]
  attention, scale = _heads(params)
  attention["query"]["kernel"][:, 0, :length] = beta / scale * selected.T
  attention["key"]["kernel"][:, 0, :length] = position.T
  attention["value"]["kernel"][:, 0, :value_dim] = z.T
  attention["out"]["kernel"][0, :value_dim] = answers
  params["logits"]["kernel"][:] = answers.T * offset / np.sqrt(width)
  return params


#: The tasks with a hand-set solution, by name (``config.init = "oracle"`` starts from it).
ORACLES = {"farthest_point": farthest_point, "multi_retrieval": multi_retrieval,
           "sparse_average": sparse_average}
