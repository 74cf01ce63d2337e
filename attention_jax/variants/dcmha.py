"""DCMHA, dynamically composable multi-head attention (:ref:`Xiao et al. 2024 <ref-xiao2024>`),
as DCFormer's JAX code computes it (jax/MaxText/layers/dc_attentions.py, one head group).

Each composition, before the softmax (on the logits) and after it (on the weights), is the
identity plus a static [N, N] mix plus low-rank mixes and gates computed from the layer's input
at the query and at the key position. Following that code: the static part is drawn small
(0.1 x Xavier) and the dynamic parts tiny, so a layer starts near, not exactly at, plain MHA;
the dynamic rank is I = N // (N // 2) and the network's hidden width 4N; the mask is applied
again after the weights composition. Its PyTorch port (pytorch/dcformer) drops the static part by
default and draws the gates 10x larger; the JAX training code is followed. Self-attention only
(DCFormer's cross-attention computes the key-wise parts with a second network, not built here).

Shape letters: I the rank of the dynamic mixes, C = 4 the compositions' parts (DCMHA_PARTS).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attention_jax import reference
from attention_jax.variants import base
from attention_jax.variants.talking_heads import TalkingHeads, mix_heads

PARTS = ("pre_query", "pre_key", "post_query", "post_key")  # the code's order of its 4 splits
RMS_NORM_EPSILON = 1e-6  # flax.linen.RMSNorm's default, as DCFormer's dw1_norm uses it


def rank(num_heads: int) -> int:
  """DCFormer's dynamic rank: N // squeeze ratio, the ratio being N // 2.

  >>> rank(4), rank(16), rank(3)
  (2, 2, 3)
  """
  return num_heads // (num_heads // 2)


def _rms_normalize(x, epsilon: float = RMS_NORM_EPSILON):
  """RMSNorm without scale over the last axis."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + epsilon)


def dynamic_weights(params, x):
  """DCFormer's DynamicWeightProjection: from the attention input x [..., L, D], for each of
  PARTS, low-rank mixes w1, w2 [..., L, I, N] (w1 RMS-normalised over heads) and gates dd
  [..., L, N] (tanh). Returns {part: (w1, w2, dd)}.

  >>> specs = Dcmha().params(in_features=8, num_heads=4, head_dim=2)
  >>> params = {k: init(jax.random.key(0), shape) for k, (shape, init) in specs.items()}
  >>> w1, w2, dd = dynamic_weights(params, jnp.ones((5, 8)))["pre_query"]
  >>> w1.shape, w2.shape, dd.shape  # [L, I, N], [L, I, N], [L, N]
  ((5, 2, 4), (5, 2, 4), (5, 4))
  """
  dtype = reference.compute_dtype(x.dtype)
  x = x.astype(dtype)
  hidden = jax.nn.gelu(jnp.einsum("...ld,dck->...lck", x, params["dw1"].astype(dtype)))
  w = jnp.einsum("...lck,ckim->...lcim", hidden, params["qkw"].astype(dtype))  # [..., L, C, 2I, N]
  i = w.shape[-2] // 2
  w1, w2 = _rms_normalize(w[..., :i, :]), w[..., i:, :]
  dd = jnp.tanh(jnp.einsum("...ld,dcm->...lcm", x, params["dd"].astype(dtype)))  # [..., L, C, N]
  return {part: (w1[..., c, :, :], w2[..., c, :, :], dd[..., c, :])
          for c, part in enumerate(PARTS)}


def compose(maps, static, query_wise, key_wise):
  """One composition (DCFormer's CrossHeadProjection) at every (query, key) pair:

    out_m = maps_m + sum_n maps_n (static[n, m] + sum_i qw1[t,i,n] qw2[t,i,m]
                                   + sum_i kw1[s,i,n] kw2[s,i,m]) + maps_m (qdd[t,m] + kdd[s,m])

  maps [..., N, T, S], static [N, N], query_wise (qw1, qw2 [..., T, I, N], qdd [..., T, N]),
  key_wise the same over S -> [..., N, T, S]. All zeros leave the maps as they are.

  >>> maps = jnp.ones((2, 3, 3))  # [N, T, S]
  >>> zeros = (jnp.zeros((3, 2, 2)), jnp.zeros((3, 2, 2)), jnp.zeros((3, 2)))
  >>> bool(jnp.all(compose(maps, jnp.zeros((2, 2)), zeros, zeros) == maps))
  True
  """
  out = maps + mix_heads(maps, static)
  (qw1, qw2, qdd), (kw1, kw2, kdd) = query_wise, key_wise
  cast = lambda a: a.astype(maps.dtype)
  hidden = jnp.einsum("...nts,...tin->...its", maps, cast(qw1))  # [..., I, T, S]
  out = out + jnp.einsum("...its,...tim->...mts", hidden, cast(qw2))
  hidden = jnp.einsum("...nts,...sin->...its", maps, cast(kw1))
  out = out + jnp.einsum("...its,...sim->...mts", hidden, cast(kw2))
  out = out + maps * jnp.swapaxes(cast(qdd), -1, -2)[..., :, :, None]  # [..., N, T, 1]
  return out + maps * jnp.swapaxes(cast(kdd), -1, -2)[..., :, None, :]  # [..., N, 1, S]


@base.register
@dataclasses.dataclass(frozen=True)
class Dcmha(base.Variant):
  """DCMHA: dw1 [D, C, 4N], qkw [C, 4N, 2I, N], dd [D, C, N], pre_static and post_static
  [N, N] under params["dcmha"] (DCFormer's DynamicWeightProjection and CrossHeadProjection)."""
  name = "dcmha"
  decoding = TalkingHeads.decoding  # the same reason: it mixes heads at each (query, key) pair

  def check(self, *, num_heads, head_dim):
    if num_heads < 2:
      raise ValueError(f"DCMHA composes heads, so it needs num_heads >= 2, got {num_heads}.")

  def params(self, *, in_features, num_heads, head_dim):
    n, d, i, c = num_heads, in_features, rank(num_heads), len(PARTS)
    hidden = 4 * n  # DCFormer: num_heads_per_group * I * 2 with its I = 2
    normal = jax.nn.initializers.normal
    static = ((n, n), normal(math.sqrt(2.0 / (n + n)) * 0.1))
    return {"dw1": ((d, c, hidden), normal(math.sqrt(2.0 / (d + hidden)))),
            "qkw": ((c, hidden, 2 * i, n), normal(math.sqrt(1.0 / hidden) * 2.0 / (n + 2) * 0.01)),
            "dd": ((d, c, n), normal(math.sqrt(2.0 / (d + n)) * 0.005)),
            "pre_static": static, "post_static": static}

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    if inputs_kv is not None and inputs_kv is not inputs_q:
      raise ValueError("DCMHA composes heads from the one input of self-attention; call it with "
                       "inputs_kv=None (DCFormer's cross-attention variant is not built here).")
    return params, dynamic_weights(params, inputs_q)  # queries and keys: the same positions

  def identity(self, params):  # every composition's part at zero; dw1 may stay as it is
    return self, {**params, self.name: {k: v if k == "dw1" else jnp.zeros_like(v)
                                        for k, v in params[self.name].items()}}

  def _compose(self, state, maps, stage):
    params, dynamic = state
    return compose(maps, params[f"{stage}_static"], dynamic[f"{stage}_query"],
                   dynamic[f"{stage}_key"])

  def logits(self, state, logits):
    return self._compose(state, logits, "pre")

  def weights(self, state, weights):
    return self._compose(state, weights, "post")
