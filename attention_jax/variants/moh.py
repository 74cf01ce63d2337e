"""MoH, mixture-of-head attention (:ref:`Jin et al. 2024 <ref-jin2024>`), as MoH-ViT/attention.py
computes it: a router scales each head's output per token before W_O; the first heads are shared
(always on), each token routes to the top k of the others.

Following that code: the gates are scaled by the head counts (shared, k, 2), which the paper's
formula lacks, so that a zero router gives gate 1; the routers have no bias and are drawn as
timm's ``trunc_normal_(std=.02)`` (cut at +-2, i.e. 100 standard deviations); with no routed
heads (k = 0, all heads shared) the gates are softmax(x W_s) * N and there is no balancing loss;
the load-balancing loss is E * sum_e mean(p_e) mean(chosen_e), weighted 0.01 and averaged over
layers (MoH-ViT/engine.py).

Shape letters: E = N - shared the routed heads, k how many of them a token uses.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attention_jax import reference
from attention_jax.variants import base

LOAD_BALANCING_WEIGHT = 0.01  # MoH-ViT/engine.py: 0.01 x the layers' mean loss
_ROUTER_INIT = jax.nn.initializers.truncated_normal(0.02, lower=-100.0, upper=100.0)


def load_balancing_loss(probs, chosen):
  """E * sum_e mean_t(p_e) * mean_t(chosen_e) over every token of probs, chosen [..., T, E]
  (MoH-ViT: mean(me * ce) * E * E). At a uniform router it is k, whatever the choice.

  >>> probs = jnp.full((4, 3), 1 / 3)  # uniform over 3 routed heads
  >>> chosen = jnp.array([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 0]], bool)  # k = 2
  >>> float(load_balancing_loss(probs, chosen))
  2.0
  """
  routed = probs.shape[-1]
  flat = lambda a: jnp.reshape(a.astype(jnp.float32), (-1, routed))
  return routed * jnp.sum(jnp.mean(flat(probs), axis=0) * jnp.mean(flat(chosen), axis=0))


@base.register
@dataclasses.dataclass(frozen=True)
class Moh(base.Variant):
  """MoH: router [D, E], shared_router [D, shared] (more than one shared head) and mix_router
  [D, 2] (shared and routed heads) under params["moh"].

  Attributes:
    shared_heads: the always-on heads, the first ones; -1: N // 2 (MoH-LLaMA3's choice).
    routed_heads: k; -1: N // 4, so that 75% of the heads are active (MoH-LLaMA3); 0: every
      head shared (MoH-ViT's routed_head=0).
    load_balancing_weight: the weight of the loss recorded in "losses".

  >>> Moh().moh_heads(16)  # (shared, routed k, routed heads E)
  (8, 4, 8)
  """
  name = "moh"
  shared_heads: int = -1
  routed_heads: int = -1
  load_balancing_weight: float = LOAD_BALANCING_WEIGHT

  def moh_heads(self, num_heads: int) -> tuple[int, int, int]:
    """(shared heads, routed k, routed heads E = N - shared), defaults resolved and checked."""
    shared = num_heads // 2 if self.shared_heads < 0 else self.shared_heads
    routed = num_heads // 4 if self.routed_heads < 0 else self.routed_heads
    if routed == 0 and shared == num_heads > 1:
      return shared, 0, 0
    if not (0 <= shared < num_heads and 1 <= routed <= num_heads - shared):
      raise ValueError(
          f"MoH needs 0 <= shared_heads < num_heads and 1 <= routed_heads <= num_heads - "
          f"shared_heads (or routed_heads=0 with shared_heads=num_heads > 1), got shared={shared}"
          f", routed={routed} of num_heads={num_heads}; use num_heads >= 4 for the defaults "
          f"(N // 2 shared, N // 4 routed) or set both.")
    return shared, routed, num_heads - shared

  def check(self, *, num_heads, head_dim):
    self.moh_heads(num_heads)

  def params(self, *, in_features, num_heads, head_dim):
    shared, k, routed = self.moh_heads(num_heads)
    specs = {"router": ((in_features, routed), _ROUTER_INIT)} if k else {}
    if shared > 1:
      specs["shared_router"] = ((in_features, shared), _ROUTER_INIT)
    if shared > 0 and k:
      specs["mix_router"] = ((in_features, 2), _ROUTER_INIT)
    return specs

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    """{"gates": [..., T, N], "probs", "chosen": the routed heads' router probabilities and which
    of them each token chose, [..., T, E] (None without routed heads)}."""
    dtype = reference.compute_dtype(inputs_q.dtype)
    x = inputs_q.astype(dtype)
    shared, k, routed = self.moh_heads(num_heads)
    router = lambda name: jax.nn.softmax(x @ params[name].astype(dtype), axis=-1)
    if k == 0:
      return {"gates": router("shared_router") * shared, "probs": None, "chosen": None}
    probs = router("router")  # [..., T, E]
    _, chosen_index = jax.lax.top_k(probs, k)  # [..., T, k]
    chosen = jnp.sum(jax.nn.one_hot(chosen_index, routed, dtype=dtype), axis=-2)  # [..., T, E]
    gates = probs * chosen
    gates = gates / jnp.maximum(jnp.sum(gates, axis=-1, keepdims=True), jnp.finfo(dtype).eps) * k
    if shared:
      shared_gates = (router("shared_router") * shared if shared > 1
                      else jnp.ones(x.shape[:-1] + (1,), dtype))
      groups = router("mix_router") * 2  # [..., T, 2]
      gates = jnp.concatenate([shared_gates * groups[..., :1], gates * groups[..., 1:]], -1)
    return {"gates": gates, "probs": probs, "chosen": chosen > 0}

  def identity(self, params):  # a zero router, every routed head chosen: every gate 1
    shared, _, routed = self.moh_heads(params["out"]["kernel"].shape[0])
    variant = dataclasses.replace(self, shared_heads=shared, routed_heads=routed)
    return variant, {**params, self.name: jax.tree.map(jnp.zeros_like, params[self.name])}

  def heads(self, state, heads):
    return heads * state["gates"][..., None].astype(heads.dtype)

  def records(self, state):
    losses = {} if state["probs"] is None else {"load_balancing": (
        self.load_balancing_weight * load_balancing_loss(state["probs"], state["chosen"]))}
    return {"intermediates": {"head_gates": state["gates"]}, base.LOSSES: losses}
