"""QK-norm with a learned scale (Henry et al. 2020, arXiv:2010.04245): each head's queries
and keys are L2-normalised along the head dimension, so that every logit is a cosine in [-1, 1],
and a learned gain g multiplies the logits in place of 1/sqrt(d_k):

  logits = g * (q / ||q||) . (k / ||k||),   g started at g0 = log2(L^2 - L),

L the sequence length the layer is trained on (Henry et al. take the 97.5th percentile of the
training lengths; here ``length``, a field). The gain is the whole scale: the step's own scale is
computed with d_k 1 (``scale_dim``), so 1/sqrt(d_k) and 1/d_k are 1 here. One gain per layer,
as in the paper, shared by its heads.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attention_jax.variants import base

EPSILON = 1e-6  # the least norm divided by, so that a zero query or key stays zero


def initial_gain(length: int) -> float:
  """g0 = log2(L^2 - L) (Henry et al. 2020, section 3).

  >>> initial_gain(64)
  11.977279923499916
  """
  return math.log2(length * length - length)


def l2_normalize(x):
  """``x / max(norm(x), EPSILON)`` along the last (head) axis: [..., H] -> [..., H].

  >>> l2_normalize(jnp.array([3.0, 4.0])).tolist()
  [0.6000000238418579, 0.800000011920929]
  """
  norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True))
  return (x / jnp.maximum(norm, EPSILON)).astype(x.dtype)


@base.register
@dataclasses.dataclass(frozen=True)
class QKNormLearned(base.Variant):
  """L2-normalised queries and keys, logits times a learned gain params[name]["gain"] [1]
  started at log2(length^2 - length).

  >>> shape, _ = QKNormLearned(length=16).params(in_features=8, num_heads=2, head_dim=4)["gain"]
  >>> shape  # one gain for the layer
  (1,)
  """
  name = "qk_norm_learned"
  length: int = 64

  def check(self, *, num_heads, head_dim):
    if self.length < 2:
      raise ValueError(f"qk_norm_learned needs length >= 2 (g0 = log2(L^2 - L)), got "
                       f"{self.length}; set head_variant_options.length to the training length.")

  def params(self, *, in_features, num_heads, head_dim):
    return {"gain": ((1,), jax.nn.initializers.constant(initial_gain(self.length)))}

  def scale_dim(self, head_dim):
    return 1

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    return params["gain"]

  def layout(self, query, key, value):
    return l2_normalize(query), l2_normalize(key), value

  def logits(self, state, logits):  # [..., N, T, S] times the layer's gain
    return logits * state[0].astype(logits.dtype)
