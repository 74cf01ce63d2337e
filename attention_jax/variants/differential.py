"""Differential attention (:ref:`Ye et al. 2025 <ref-ye2025>`, the DIFF Transformer), as
microsoft/unilm's Diff-Transformer/multihead_diffattn.py computes it: each head's query and key
split into two halves of width h = H / 2 give two softmax maps, and the head attends with their
difference,

  weights = softmax(Q1 K1^T / sqrt(h)) - lambda softmax(Q2 K2^T / sqrt(h)),
  lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
  lambda_init = 0.8 - 0.6 exp(-0.3 l)   (l the layer index, from 0),

to the values of width H; each head's output then gets an RMSNorm (eps 1e-5, learned scale [H])
and is multiplied by 1 - lambda_init before W_O. The lambda vectors [h] are drawn from a normal of
standard deviation 0.1. As in that code, the halves are consecutive sub-heads (head n's features
0..h-1 and h..2h-1); the code asks for half the heads of the Transformer it is compared with.
QK-norm and RoPE act on the halves; the recorded logits are the 2N halves' [..., 2N, T, S].
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attention_jax.variants import base

RMS_NORM_EPSILON = 1e-5  # the code's subln


def lambda_init(layer: int) -> float:
  """0.8 - 0.6 exp(-0.3 layer), the code's lambda_init_fn of the layer index.

  >>> round(lambda_init(0), 6), round(lambda_init(11), 3)
  (0.2, 0.778)
  """
  return 0.8 - 0.6 * math.exp(-0.3 * layer)


def _halves(x):
  """[..., L, N, 2h] -> [..., L, 2N, h]: head n's halves become sub-heads 2n and 2n + 1."""
  return jnp.reshape(x, x.shape[:-2] + (2 * x.shape[-2], x.shape[-1] // 2))


@base.register
@dataclasses.dataclass(frozen=True)
class Differential(base.Variant):
  """Differential attention: lambda_q1, lambda_k1, lambda_q2, lambda_k2 [h] and the output
  RMSNorm's ``scale`` [H] under params["differential"].

  Attributes:
    layer: the layer index l of lambda_init (the encoder sets it).

  >>> round(Differential(layer=3).lambda_init, 3)  # 0.8 - 0.6 exp(-0.9)
  0.556
  """
  name = "differential"
  decoding = ("keeps keys half as wide as its values, which the key/value cache does not "
              "hold; decode with another variant.")
  layer: int = 0

  @classmethod
  def for_layer(cls, *, layer, num_layers, **options):
    return base.build(cls, {**options, "layer": layer})

  @property
  def lambda_init(self) -> float:
    return lambda_init(self.layer)

  def check(self, *, num_heads, head_dim):
    if head_dim % 2:
      raise ValueError(f"differential attention splits each head in two halves, so the head dim "
                       f"must be even, got {head_dim}.")

  def params(self, *, in_features, num_heads, head_dim):
    vector = ((head_dim // 2,), jax.nn.initializers.normal(0.1))
    return {"lambda_q1": vector, "lambda_k1": vector, "lambda_q2": vector, "lambda_k2": vector,
            "scale": ((head_dim,), jax.nn.initializers.ones)}

  def query_key_dim(self, head_dim):
    return head_dim // 2

  scale_dim = query_key_dim  # the scale is that of a half head

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    term = lambda a, b: jnp.exp(jnp.sum(params[a] * params[b]).astype(jnp.float32))
    lam = term("lambda_q1", "lambda_k1") - term("lambda_q2", "lambda_k2") + self.lambda_init
    return lam, params["scale"]

  def layout(self, query, key, value):
    return _halves(query), _halves(key), value

  def weights(self, state, weights):
    pairs = jnp.reshape(weights, weights.shape[:-3] + (-1, 2) + weights.shape[-2:])
    return pairs[..., 0, :, :] - state[0].astype(weights.dtype) * pairs[..., 1, :, :]

  def heads(self, state, heads):
    x = heads.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + RMS_NORM_EPSILON)
    return (x.astype(heads.dtype) * state[1].astype(heads.dtype)) * (1 - self.lambda_init)
