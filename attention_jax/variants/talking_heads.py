"""Talking heads (:ref:`Shazeer et al. 2020 <ref-shazeer2020>`), as mesh-tensorflow's
TalkingHeadsSelfAttention computes it: the logits of all heads at one (query, key) pair mixed by
a learned [N, N] matrix before the softmax, the weights by another after it.

Following that code: the mixes have no bias and are drawn from a truncated normal (cut at two
standard deviations, standard deviation 1/sqrt(N), not rescaled after the cut:
``tf.truncated_normal_initializer``); bias and mask are added after the logits mix; attention
dropout acts on the mixed weights with one mask [..., N, 1, S] shared by every query (its
``noise_shape`` drops the length axis), whatever ``broadcast_dropout`` says. Its 1/sqrt(d_k) sits in W_Q's initialisation; here it is the usual scale (the
same function).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attention_jax.variants import base


def mix_heads(maps, matrix):
  """out_m = sum_n maps_n P[n, m] at every (query, key) pair: [..., N, T, S], P [N, M] ->
  [..., M, T, S] (mesh-tensorflow's projection, reducing the input heads).

  >>> maps = jnp.arange(2.0).reshape(2, 1, 1)  # head 0: 0, head 1: 1
  >>> mix_heads(maps, jnp.array([[1.0, 0.0], [2.0, 3.0]]))[:, 0, 0]  # [0 + 2, 0 + 3]
  Array([2., 3.], dtype=float32)
  """
  return jnp.einsum("...nts,nm->...mts", maps, matrix.astype(maps.dtype))


@base.register
@dataclasses.dataclass(frozen=True)
class TalkingHeads(base.Variant):
  """Talking heads: ``logits_mix`` and ``weights_mix`` [N, N] under params["talking_heads"].

  >>> sorted(TalkingHeads().params(in_features=8, num_heads=4, head_dim=2))
  ['logits_mix', 'weights_mix']
  """
  name = "talking_heads"
  decoding = ("mixes every head's weights at each (query, key) pair, which decoding with a "
              "key/value cache does not keep; decode with another variant.")
  dropout_shares_queries = True

  def params(self, *, in_features, num_heads, head_dim):
    init = jax.nn.initializers.truncated_normal(1 / math.sqrt(num_heads))
    return {"logits_mix": ((num_heads, num_heads), init),
            "weights_mix": ((num_heads, num_heads), init)}

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    return params

  def identity(self, params):
    eye = jnp.eye(params["out"]["kernel"].shape[0])
    return self, {**params, self.name: {"logits_mix": eye, "weights_mix": eye}}

  def logits(self, state, logits):
    return mix_heads(logits, state["logits_mix"])

  def weights(self, state, weights):
    return mix_heads(weights, state["weights_mix"])
