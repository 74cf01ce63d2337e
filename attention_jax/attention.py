"""dot_product_attention: one contract, several implementations, chosen by name.

Shape letters: T query length, S key/value length, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import chunked
from attention_jax import cudnn
from attention_jax import pallas_tpu
from attention_jax import reference
from attention_jax import xla

IMPLEMENTATIONS = ("reference", "xla", "chunked", "cudnn", "pallas_tpu")

# Accelerator kernels run on one backend only; the other implementations run everywhere.
REQUIRED_BACKEND = {"cudnn": "gpu", "pallas_tpu": "tpu"}


def _chunked_unsupported_reason(query, key, value, *, dropout_rate, return_weights,
                                has_bias_or_mask):
  del query, key, value, has_bias_or_mask
  if dropout_rate > 0.0:
    return "chunked attention has no attention dropout"
  if return_weights:
    return "chunked attention never forms the weights, so it cannot return them"
  return None


_UNSUPPORTED_REASON = {
    "reference": lambda *args, **kwargs: None,  # the formula serves every request
    "xla": xla.unsupported_reason,
    "chunked": _chunked_unsupported_reason,
    "cudnn": cudnn.unsupported_reason,
    "pallas_tpu": pallas_tpu.unsupported_reason,
}


def unsupported_reason(name, query, key, value, *, backend: str, **request) -> str | None:
  """Why implementation ``name`` cannot serve this request on ``backend``, or None if it can."""
  required = REQUIRED_BACKEND.get(name)
  if required is not None and backend != required:
    return f"{name!r} runs only on the {required} backend, and this one is {backend}"
  return _UNSUPPORTED_REASON[name](query, key, value, **request)


# On CPU, blockwise attention from this length on; below it the reference formula, whose
# head-major einsums beat jax.nn's [B, T, N, H] ones. Measured on the 2-core CPU (2026-11-22,
# `scripts/benchmark_attention.py --rounds 11`, 8 heads), time relative to jax.nn forward /
# forward+backward: T = 33: reference 0.67 / 0.84, chunked 1.88 / 2.67; T = 128: 0.73 / 0.88 and
# 0.95 / 1.73; T = 256: 0.72 / 0.82 and 0.59 / 1.13; T = 512: 0.73 / 0.74 and 0.39 / 0.66;
# T = 1024: 0.71 / 0.60 and 0.31 / 0.46.
CHUNKED_MIN_LENGTH_CPU = 512

# On TPU, the Pallas flash kernel from this length on. NOT measured (no TPU has run this code
# yet): the kernel's blocks are 128 wide, and XLA's fused attention is hard to beat while the
# T x S logits fit comfortably. Calibrate with scripts/benchmark_attention.py on a TPU.
PALLAS_MIN_LENGTH_TPU = 1024


# On GPU, where cuDNN cannot serve a call (float32, head dims it lacks), XLA's attention ran
# 2-9x faster than the chunked kernel's loops on an H100 but materialises the [..., N, T, S]
# logits and probabilities: its forward+backward held 2.5x the float32 logits' bytes in temporary
# memory (10 GiB at B = 1, N = 16, T = S = 8192), per attention call and layer. Above this many
# bytes of float32 logits the chunked kernel (memory linear in T) takes over, so that one call
# holds about 5 GiB at most, within a 16 GB GPU such as Colab's T4 (not measured on one). README
# "On an NVIDIA H100" has the measurements.
XLA_MAX_LOGITS_BYTES_GPU = 2 ** 31


def _automatic_order(query, key, backend: str) -> tuple[str, ...]:
  """Implementations to try, fastest first, for this backend and shape."""
  longest = max(query.shape[-3], key.shape[-3])
  if backend == "cpu":
    return ("chunked", "reference") if longest >= CHUNKED_MIN_LENGTH_CPU else ("reference",)
  if backend == "gpu":
    logits_bytes = 4 * math.prod(query.shape[:-1]) * key.shape[-3]  # [..., T, N] x S float32
    return ("cudnn", "chunked" if logits_bytes > XLA_MAX_LOGITS_BYTES_GPU else "xla", "reference")
  if backend == "tpu" and longest >= PALLAS_MIN_LENGTH_TPU:
    return ("pallas_tpu", "xla", "reference")
  return ("xla", "reference")


def select_implementation(query, key, value, bias=None, mask=None, *, dropout_rate: float = 0.0,
                          return_weights: bool = False, implementation: str | None = None,
                          backend: str | None = None) -> str:
  """The name of the implementation ``dot_product_attention`` runs for these arguments.

  ``implementation=None`` picks the first implementation that can serve the request from a list
  per backend (``backend`` defaults to ``jax.default_backend()``):

  - cpu: "chunked" when T or S >= CHUNKED_MIN_LENGTH_CPU, else "reference" (both measured
    faster than jax.nn here);
  - gpu: "cudnn" (float16/bfloat16, head_dim a multiple of 8 up to 128, value shaped like key),
    else "xla" while the float32 logits would take at most XLA_MAX_LOGITS_BYTES_GPU, else
    "chunked";
  - tpu: "pallas_tpu" when T or S >= PALLAS_MIN_LENGTH_TPU and both are multiples of 128, else
    "xla";
  - and "reference" when none of these can (attention dropout, returned weights).

  A named implementation that cannot serve the request raises ``ValueError`` with the reason;
  nothing falls back silently. Shapes are enough: pass ``jax.ShapeDtypeStruct``s to ask what a
  call would run, and ``backend="tpu"`` to ask what it would run there.

  >>> select_implementation(q, k, v, return_weights=True)
  'reference'
  >>> select_implementation(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16),
  ...                       v.astype(jnp.bfloat16), backend="gpu")
  'cudnn'
  """
  backend = jax.default_backend() if backend is None else backend
  request = dict(dropout_rate=dropout_rate, return_weights=return_weights,
                 has_bias_or_mask=bias is not None or mask is not None)
  if implementation is None:
    for name in _automatic_order(query, key, backend):
      if unsupported_reason(name, query, key, value, backend=backend, **request) is None:
        return name
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}.")
  reason = unsupported_reason(implementation, query, key, value, backend=backend, **request)
  if reason is not None:
    raise ValueError(
        f"implementation={implementation!r} cannot serve this call: {reason}; "
        "use implementation=None to pick one that can.")
  return implementation


# The implementations that take (query, key, value, bias, mask, *, scale, is_causal).
_KERNELS = {
    "xla": xla.xla_attention,
    "chunked": chunked.chunked_attention,
    "cudnn": cudnn.cudnn_attention,
    "pallas_tpu": pallas_tpu.pallas_tpu_attention,
}


def dot_product_attention(query, key, value, bias=None, mask=None, *,
                          scale: float | None = None, is_causal: bool = False,
                          dropout_rate: float = 0.0, dropout_rng=None,
                          return_weights: bool = False, implementation: str | None = None):
  r"""Scaled dot-product attention, softmax(Q K^T * scale + bias) V, per head.

  Args:
    query: [..., T, N, H].
    key: [..., S, K, H]; N must be a multiple of K (grouped-query attention: query head n reads
      key/value head n // (N // K)).
    value: [..., S, K, H_v].
    bias: optional additive logits broadcastable to [..., N, T, S]; -inf means "do not attend".
    mask: optional bool broadcastable to [..., N, T, S], True = attend.
    scale: multiplies Q K^T; None means 1 / sqrt(H). Any float is allowed.
    is_causal: query t attends only to keys s <= t (top-left aligned, as jax.nn).
    dropout_rate: attention dropout on the weights; needs ``dropout_rng``. 0 disables it.
    dropout_rng: a PRNG key for attention dropout.
    return_weights: also return the softmax weights [..., N, T, S] (float32, before dropout).
    implementation: "reference" (the formula), "xla" (jax.nn.dot_product_attention), "chunked"
      (blockwise, memory linear in T and S; block sizes via ``chunked_attention``), "cudnn"
      (cuDNN flash attention on NVIDIA GPUs), "pallas_tpu" (the Pallas flash kernel on TPU) or
      None (automatic, see ``select_implementation``).

  Returns:
    [..., T, N, H_v] in the dtype of ``query``; with ``return_weights`` a pair (output, weights).
    The softmax runs in float32 (at least) with the row max subtracted; a query row with no key to
    attend to gives zeros and zero weights, with finite gradients.

  Raises:
    ValueError: at trace time, for malformed shapes or dtypes, or an implementation that cannot
      serve the request.

  Example:
    >>> q = k = v = jnp.ones((2, 16, 4, 8))  # (B, T, N, H)
    >>> dot_product_attention(q, k, v, is_causal=True).shape
    (2, 16, 4, 8)
  """
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  mask = None if mask is None else jnp.asarray(mask)
  bias = None if bias is None else jnp.asarray(bias)
  _checks.check_qkv(query, key, value)
  q_len, num_heads, head_dim = query.shape[-3:]
  target = query.shape[:-3] + (num_heads, q_len, key.shape[-3])  # [..., N, T, S]
  _checks.check_mask_and_bias(mask, bias, target)
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  if dropout_rate > 0.0 and dropout_rng is None:
    raise ValueError(f"dropout_rate={dropout_rate} needs a dropout_rng (a jax.random key).")
  name = select_implementation(query, key, value, bias, mask, dropout_rate=dropout_rate,
                               return_weights=return_weights, implementation=implementation)

  scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
  if name in _KERNELS:
    return _KERNELS[name](query, key, value, bias, mask, scale=scale, is_causal=is_causal)
  return reference.reference_attention(
      query, key, value, bias, mask, scale=scale, is_causal=is_causal,
      dropout_rate=dropout_rate, dropout_rng=dropout_rng, return_weights=return_weights)
