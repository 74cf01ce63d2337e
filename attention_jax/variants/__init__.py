"""Variants of multi-head attention as plug-ins: one file per variant, each a ``base.Variant``
registered by name (``REGISTRY``), whose hooks ``multihead.multi_head_attention_step`` calls::

  name            what it changes                                          file
  mha             nothing (every hook at its identity)                     base
  talking_heads   logits and weights mixed across heads (Shazeer 2020)     talking_heads
  dcmha           logits and weights composed dynamically (Xiao 2024)      dcmha
  moh             heads gated by a router (Jin 2024)                       moh
  overlap         heads widened into their neighbours (Zhang 2024)         overlap
  gated           heads gated by sigmoid(X W) per feature (Qiu 2025)       gated
  gated_headwise  the same, one gate per head                              gated
  gated_open      the per-feature gate as 2 sigmoid(X W), open (1) at start  gated
  differential    the difference of two softmax maps (Ye 2025)             differential
  sinks           a learned sink logit per head in the softmax (GPT-OSS)   sinks
  sigmoid         sigmoid(logit - log S) weights, no row normalisation     sigmoid
                  (Ramapuram 2024)
  qk_norm_learned L2-normed queries and keys, a learned gain   qk_norm_learned
                  started at log2(L^2 - L) (Henry 2020)

A new variant is one file here (a registered subclass of ``base.Variant``) and its import below;
the modules, the encoder, the configs and the generic tests then know it by name. One in your own
package needs neither: name it by import path, ``head_variant="my_package.my_module:MyVariant"``.
"""

from attention_jax.variants.base import LOSSES
from attention_jax.variants.base import REGISTRY
from attention_jax.variants.base import Variant
from attention_jax.variants.base import auxiliary_loss
from attention_jax.variants.base import get
from attention_jax.variants.base import layer_variant
from attention_jax.variants.base import register
from attention_jax.variants.base import variant_class
from attention_jax.variants import talking_heads  # noqa: F401  (each import registers its variant)
from attention_jax.variants import dcmha  # noqa: F401
from attention_jax.variants import moh  # noqa: F401
from attention_jax.variants import overlap  # noqa: F401
from attention_jax.variants import gated  # noqa: F401
from attention_jax.variants import differential  # noqa: F401
from attention_jax.variants import sinks  # noqa: F401
from attention_jax.variants import sigmoid  # noqa: F401
from attention_jax.variants import qk_norm_learned  # noqa: F401
