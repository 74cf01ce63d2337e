"""Learnable attention sinks (GPT-OSS, :ref:`OpenAI 2025 <ref-openai2025>`): one learned logit
per head joins every row's softmax denominator, so that a head can give a query less than all
of its weight, or nearly none, without a token to park it on.

As gpt-oss's reference ``sdpa`` (gpt_oss/torch/model.py) computes it: the sink S_n is appended
to each row of head n's scaled, masked logits, the softmax runs over S + 1 entries and the
sink's column is dropped. The kernels serve it as ``dot_product_attention(sinks=...)`` (the
reference and the blockwise kernel, with its gradient). The sinks start as Hugging Face's
GptOss ``_init_weights`` draws them, from a normal of standard deviation 0.02; a sink fixed at 0
is softmax-off-by-one (Miller 2023).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attention_jax import reference
from attention_jax.variants import base


@base.register
@dataclasses.dataclass(frozen=True)
class Sinks(base.Variant):
  """One sink logit per head: params["sinks"]["sinks"] [N].

  >>> shape, _ = Sinks().params(in_features=8, num_heads=4, head_dim=2)["sinks"]
  >>> shape  # [N]
  (4,)
  """
  name = "sinks"

  def params(self, *, in_features, num_heads, head_dim):
    return {"sinks": ((num_heads,), jax.nn.initializers.normal(0.02))}

  def prepare(self, params, inputs_q, inputs_kv, *, num_heads):
    return params["sinks"]

  def attention_arguments(self, state):
    return {"sinks": state}

  def identity(self, params):  # a sink at the least logit takes no weight: plain softmax
    sinks = params[self.name]["sinks"]
    least = jnp.full_like(sinks, reference.least_row_max(reference.compute_dtype(sinks.dtype)))
    return self, {**params, self.name: {"sinks": least}}
