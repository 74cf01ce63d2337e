"""Sigmoid attention (:ref:`Ramapuram et al. 2024 <ref-ramapuram2024>`): each weight is
sigmoid(scaled logit + b), with b = -log(S) by default and no normalisation over the row.

As apple/ml-sigmoid-attention's reference computes it (its ``sigmoid_attn``: the logits
Q K^T / sqrt(d_k) plus the bias b, the masked entries at -inf, the element-wise sigmoid, then
the values). The kernels serve it as ``dot_product_attention(normalizer="sigmoid")`` (the
reference and the blockwise kernel, with its backward). It adds no parameters; the paper
stabilises its larger models with LayerScale and QK-norm, which the encoder has as options of
its own (``normalize_qk``).

With a key/value cache the key length S is the cache's size, not the number of tokens seen, so
b = -log(S) would change with it; decoding is refused (give ``bias`` to fix b, and it decodes).
"""

from __future__ import annotations

import dataclasses

from attention_jax.variants import base


@base.register
@dataclasses.dataclass(frozen=True)
class Sigmoid(base.Variant):
  """Sigmoid weights, b = -log(S) (``bias=None``) or a fixed ``bias``.

  >>> Sigmoid().attention_arguments(None)
  {'normalizer': 'sigmoid', 'sigmoid_bias': None}
  """
  name = "sigmoid"
  bias: float | None = None

  @property
  def decoding(self):  # an instance's answer: a fixed bias decodes
    if self.bias is not None:
      return None
    return ("sets its bias to -log(S), S the key length, which a key/value cache's size is not; "
            "give the variant a fixed bias (Sigmoid(bias=...)) to decode.")

  def attention_arguments(self, state):
    del state
    return {"normalizer": "sigmoid", "sigmoid_bias": self.bias}

  def identity(self, params):  # a sigmoid never normalises its row: no setting is plain MHA
    del params
    return None
