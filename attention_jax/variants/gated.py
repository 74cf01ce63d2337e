"""Gated attention (:ref:`Qiu et al. 2025 <ref-qiu2025>`, the gate of
Qwen3-Next): each head's output is multiplied by sigmoid(X W_g) before W_O, X
being the layer's query input.

As qiuzh20/gated_attention's modeling_qwen3.py computes it: one gate per head
("headwise", W_g [D, N]) or per feature ("elementwise", W_g [D, N, H], the
paper's best and Qwen3-Next's). The gate's columns are extra columns of its
q_proj (no bias there by default), drawn as the model's other linear layers
are: from a normal of standard deviation 0.02 (its ``initializer_range``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attention_jax.variants import base


@base.register
@dataclasses.dataclass(frozen=True)
class Gated(base.Variant):
  """Elementwise output gate: params["gated"]["gate"] [D, N, H].

  >>> shape, _ = Gated().params(in_features=8, num_heads=4, head_dim=2)["gate"]
  >>> shape  # [D, N, H]
  (8, 4, 2)
  """
  name = "gated"
  headwise = False  # one gate per head, W_g [D, N], instead of one per feature

  def params(self, *, in_features, num_heads, head_dim):
    shape = (in_features, num_heads) + (() if self.headwise else (head_dim,))
    return {"gate": (shape, jax.nn.initializers.normal(0.02))}

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    gate = params["gate"].astype(inputs_q.dtype)  # [D, N(, H)]
    return jax.nn.sigmoid(jnp.tensordot(inputs_q, gate, axes=1))

  def heads(self, state, heads):  # heads [..., T, N, H]
    gate = state if state.ndim == heads.ndim else state[..., None]
    return heads * gate.astype(heads.dtype)


@base.register
@dataclasses.dataclass(frozen=True)
class GatedHeadwise(Gated):
  """Headwise output gate: params["gated_headwise"]["gate"] [D, N]."""
  name = "gated_headwise"
  headwise = True


@base.register
@dataclasses.dataclass(frozen=True)
class GatedOpen(Gated):
  """The elementwise gate started open: 2 sigmoid(X W_g), which is 1 at W_g = 0 (plain
  attention) and about 1 at initialisation, where the paper's gate, sigmoid(X W_g), halves each
  head's output. A control of the gate's effect apart from its starting value; its range is
  (0, 2) instead of (0, 1).

  >>> variant = GatedOpen()
  >>> state = variant.prepare({"gate": jnp.zeros((8, 4, 2))}, jnp.ones((3, 8)), None, num_heads=4)
  >>> float(state.min()), float(state.max())  # open: every gate exactly 1 at W_g = 0
  (1.0, 1.0)
  """
  name = "gated_open"

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    return 2.0 * super().prepare(params, inputs_q, inputs_kv, num_heads=num_heads)

  def identity(self, params):
    return self, {**params, self.name: {"gate": jnp.zeros_like(params[self.name]["gate"])}}
