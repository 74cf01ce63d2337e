"""dot_product_attention: one contract, several implementations, chosen by name.

Shape letters: T query length, S key/value length, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import contextlib
import inspect
import math

import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import chunked
from attention_jax import cudnn
from attention_jax import masks as masks_lib
from attention_jax import mods as mods_lib
from attention_jax import pallas_gpu
from attention_jax import pallas_tpu
from attention_jax import reference
from attention_jax import xla

#: The names ``implementation=`` takes.
IMPLEMENTATIONS = ("reference", "xla", "chunked", "cudnn", "pallas_tpu", "pallas_gpu")

#: Accelerator kernels run on one backend only; the other implementations run everywhere.
REQUIRED_BACKEND = {"cudnn": "gpu", "pallas_tpu": "tpu", "pallas_gpu": "gpu"}

#: What each implementation supports under JAX's transformations, beyond jit, vmap, grad, remat,
#: scan, shard_map and sharded jit, which all of them do.
TRANSFORMS = {
    "reference": "forward and reverse mode (jvp, jacfwd, hessian)",
    "xla": "forward and reverse mode (jvp, jacfwd, hessian)",
    "chunked": "reverse mode and hessian (a custom VJP); jvp and jacfwd raise ValueError",
    "cudnn": "reverse mode only (jax's cuDNN custom VJP)",
    "pallas_tpu": "reverse mode only (the kernel's custom VJP)",
    "pallas_gpu": "reverse mode only (its custom VJP); arrays a mod closes over get no gradient",
}


def _chunked_unsupported_reason(query, key, value, request: _checks.Request) -> str | None:
  del query, key, value
  if request.dropout_rate > 0.0:
    return "chunked attention has no attention dropout"
  if request.return_weights:
    return "chunked attention never forms the weights, so it cannot return them"
  if request.hooks:
    return "chunked attention cannot serve hooks (a head variant's maps)"
  return None


_UNSUPPORTED_REASON = {
    "reference": lambda *args: None,  # the formula serves every request
    "xla": xla.unsupported_reason,
    "chunked": _chunked_unsupported_reason,
    "cudnn": cudnn.unsupported_reason,
    "pallas_tpu": pallas_tpu.unsupported_reason,
    "pallas_gpu": pallas_gpu.unsupported_reason,
}


def unsupported_reason(name, query, key, value, request: _checks.Request) -> str | None:
  """Why implementation ``name`` cannot serve this request (on ``request.backend``), or None if
  it can."""
  required = REQUIRED_BACKEND.get(name)
  if required is not None and request.backend != required:
    return f"{name!r} runs only on the {required} backend, and this one is {request.backend}"
  return _UNSUPPORTED_REASON[name](query, key, value, request)


#: On CPU, blockwise attention from this length on, below it the reference formula
#: (docs/performance.md, "Where the defaults come from").
CHUNKED_MIN_LENGTH_CPU = 256

#: The architectures where an accelerator kernel has been run against the float64 reference and
#: timed, so that it is chosen automatically: CUDA compute capabilities for cuDNN (Hopper: an
#: H100 and an H200, docs/performance.md), TPU device kinds by prefix for the Pallas kernel
#: (none yet: it stays available by name, though not on TPU v2/v3, jax issue 18595), compute
#: capabilities for the fused Pallas GPU kernel (none yet: by name only).
MEASURED_ON = {"cudnn": ("9.0",), "pallas_tpu": (), "pallas_gpu": ()}

#: The compute capability of NVIDIA GPUs by device kind (prefix), for when only the kind is known.
COMPUTE_CAPABILITY = {
    "NVIDIA H100": "9.0", "NVIDIA H200": "9.0", "NVIDIA GH200": "9.0", "NVIDIA H800": "9.0",
    "NVIDIA B200": "10.0", "NVIDIA GB200": "10.0", "NVIDIA A100": "8.0", "NVIDIA A10": "8.6",
    "NVIDIA L4": "8.9", "NVIDIA L40": "8.9", "Tesla T4": "7.5", "Tesla V100": "7.0",
}

#: On GPU without cuDNN, XLA's attention (faster, but it materialises the logits) up to this many
#: bytes of float32 logits, the chunked kernel above (docs/performance.md).
XLA_MAX_LOGITS_BYTES_GPU = 2 ** 31


def architecture(backend: str, device_kind: str | None,
                 compute_capability: str | None = None) -> str | None:
  """What MEASURED_ON is keyed by: on GPU the CUDA compute capability (given, else looked up from
  the device kind in COMPUTE_CAPABILITY), elsewhere the device kind; None when unknown.

  >>> architecture("gpu", "NVIDIA H200")
  '9.0'
  """
  if backend != "gpu":
    return device_kind
  if compute_capability is not None:
    return str(compute_capability)
  kinds = [kind for kind in COMPUTE_CAPABILITY
           if device_kind is not None and device_kind.startswith(kind)]
  return COMPUTE_CAPABILITY[max(kinds, key=len)] if kinds else None  # the longest prefix


def _measured(name: str, arch: str | None) -> bool:
  return arch is not None and any(arch.startswith(kind) for kind in MEASURED_ON[name])


def _automatic_order(query, key, backend: str, arch: str | None) -> tuple[str, ...]:
  """Implementations to try, fastest first, for this backend, architecture and shape."""
  longest = max(query.shape[-3], key.shape[-3])
  if backend == "cpu":
    return ("chunked", "reference") if longest >= CHUNKED_MIN_LENGTH_CPU else ("reference",)
  # "chunked" wherever "xla" cannot serve (a score_mod, sinks, sigmoid): memory linear in T
  if backend == "gpu":
    logits_bytes = 4 * math.prod(query.shape[:-1]) * key.shape[-3]  # [..., T, N] x S float32
    portable = ("chunked", "xla") if logits_bytes > XLA_MAX_LOGITS_BYTES_GPU else (
        "xla", "chunked")
    return ("cudnn",) * _measured("cudnn", arch) + ("pallas_gpu",) * _measured(
        "pallas_gpu", arch) + portable + ("reference",)
  if backend == "tpu":
    return ("pallas_tpu",) * _measured("pallas_tpu", arch) + ("xla", "chunked", "reference")
  return ("xla", "chunked", "reference")


def _device(backend: str):
  """The first device of ``backend`` when it is the one JAX runs on, else None (unknown)."""
  return jax.devices()[0] if backend == jax.default_backend() else None


def select_implementation(query, key, value, bias=None, mask=None, *, dropout_rate: float = 0.0,
                          return_weights: bool = False, return_residual: bool = False,
                          logits_soft_cap: float | None = None,
                          implementation: str | None = None, backend: str | None = None,
                          device_kind: str | None = None,
                          compute_capability: str | None = None, **call) -> str:
  """The name of the implementation ``dot_product_attention`` runs for these arguments.

  ``call``: the call's other arguments, as ``dot_product_attention`` takes them (``deterministic``,
  ``module``, ``score_mod``, ``mask_mod``, ``block_mask``, ``sinks``, ``normalizer`` matter; an
  unknown name raises TypeError). ``implementation=None`` picks the first that can serve the
  request, for ``backend`` (default ``jax.default_backend()``), ``device_kind`` and, on GPU,
  ``compute_capability`` (default: those of its first device, or COMPUTE_CAPABILITY's):

  - cpu: "chunked" when T or S >= CHUNKED_MIN_LENGTH_CPU, else "reference";
  - gpu: "cudnn" on the architectures in MEASURED_ON, then "pallas_gpu" on those in MEASURED_ON,
    else "xla" while the float32 logits take at most XLA_MAX_LOGITS_BYTES_GPU, else "chunked";
  - tpu: "pallas_tpu" on the TPUs in MEASURED_ON (none yet), else "xla";
  - "chunked" wherever "xla" cannot serve (a score_mod, sinks, the sigmoid); a mask_mod never
    goes to "cudnn" or "pallas_tpu" unless named;
  - "reference" when none of these can (dropout, returned weights).

  A named implementation that cannot serve raises ``ValueError`` with the reason; nothing falls
  back silently. Shapes are enough (``jax.ShapeDtypeStruct``).

  >>> q = k = v = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  >>> select_implementation(q, k, v, return_weights=True)
  'reference'
  >>> select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA H200")
  'cudnn'
  >>> select_implementation(q, k, v, backend="gpu", compute_capability="8.0")  # not measured
  'xla'
  """
  unknown = sorted(set(call) - set(inspect.signature(dot_product_attention).parameters))
  if unknown:
    raise TypeError(f"select_implementation() got arguments that dot_product_attention does not "
                    f"take: {unknown}.")
  dropout_rate = 0.0 if call.get("deterministic") else dropout_rate
  return_weights = return_weights or call.get("module") is not None or bool(
      call.get("return_logits"))  # the maps: only the formula forms them
  backend = jax.default_backend() if backend is None else backend
  device = _device(backend)
  if device is not None and device_kind is None and compute_capability is None:
    # the device this runs on; a kind or capability given asks about another device
    device_kind = device.device_kind
    compute_capability = getattr(device, "compute_capability", None)
  request = _checks.Request(
      dropout_rate=dropout_rate, return_weights=return_weights, return_residual=return_residual,
      logits_soft_cap=logits_soft_cap, device_kind=device_kind, backend=backend,
      score_mod=call.get("score_mod") is not None,
      mask_mod=call.get("mask_mod") is not None or call.get("block_mask") is not None,
      sinks=call.get("sinks") is not None, normalizer=call.get("normalizer", "softmax"),
      hooks=call.get("hooks") is not None,
      arrays=tuple(name for name, given in [("mask", mask), ("bias", bias)] + [
          (name, call.get(name)) for name in _checks.STRUCTURE_ARRAYS] if given is not None))
  if implementation is None:
    arch = architecture(backend, device_kind, compute_capability)
    for name in _automatic_order(query, key, backend, arch):
      if request.mask_mod and name in ("cudnn", "pallas_tpu"):
        continue  # they take a mask_mod only as a dense mask: asked for by name, never chosen
      if unsupported_reason(name, query, key, value, request) is None:
        return name
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}.")
  reason = unsupported_reason(implementation, query, key, value, request)
  if reason is not None:
    raise ValueError(
        f"implementation={implementation!r} cannot serve this call: {reason}; "
        "use implementation=None to pick one that can.")
  return implementation


def structure_mask(mask, q_len: int, kv_len: int, *, local_window_size=None,
                   query_seq_lengths=None, key_value_seq_lengths=None, query_segment_ids=None,
                   key_segment_ids=None):
  """``mask`` combined with the masks that the jax.nn-style arguments describe, broadcastable to
  [..., N, T, S] (None when there is nothing to mask). Causality is not included.

  >>> structure_mask(None, 4, 4, local_window_size=1).shape
  (4, 4)
  """
  window = _checks.local_window(local_window_size)
  return masks_lib.combine_masks(
      mask, None if window is None else masks_lib.local_window_mask(q_len, kv_len, window),
      masks_lib.seq_lengths_mask(query_seq_lengths, key_value_seq_lengths, q_len, kv_len),
      None if query_segment_ids is None else masks_lib.segment_mask(query_segment_ids,
                                                                    key_segment_ids))


# The kernels that take (query, key, value, bias, mask, *, scale, is_causal[, return_residual]).
_KERNELS = {
    "xla": xla.xla_attention,
    "cudnn": cudnn.cudnn_attention,
    "pallas_tpu": pallas_tpu.pallas_tpu_attention,
}


#: What a query row with no key to attend to returns (``empty_rows=``): "mean" (jax.nn's and
#: flax's uniform weights) or "zero"; rows past ``query_seq_lengths`` are zeros either way.
EMPTY_ROWS = ("mean", "zero")

def matmul_precision(precision) -> str | None:
  """flax's ``precision`` (a lax.Precision, its name, or a pair) as the name that
  ``jax.default_matmul_precision`` takes; None stays None.

  >>> matmul_precision(jax.lax.Precision.HIGHEST), matmul_precision(None)
  ('highest', None)
  """
  if precision is None:
    return None
  if isinstance(precision, (tuple, list)):  # (lhs, rhs): the higher of the two
    return max((matmul_precision(p) for p in precision), key=_PRECISIONS.index)
  return str(jax.lax.Precision(precision)).lower()


_PRECISIONS = ("default", "high", "highest")


def default_precision(precision):
  """A context in which the matrix products run at ``precision`` (None: as they would)."""
  name = matmul_precision(precision)
  return contextlib.nullcontext() if name is None else jax.default_matmul_precision(name)


def _sow(module, weights) -> None:
  """Sows the weights as flax's attention functions do with ``module=`` (Linen or NNX)."""
  if hasattr(module, "is_mutable_collection"):  # Linen
    module.sow("intermediates", "attention_weights", weights)
  else:
    from flax import nnx  # pylint: disable=g-import-not-at-top (imported by the caller already)
    module.sow(nnx.Intermediate, "attention_weights", weights)


def _can_empty_rows(mask, structure, window, mask_mod) -> bool:
  """Whether a row can be left with no key (a mask, a window, key lengths, segment ids or a
  mask_mod)."""
  return mask is not None or window is not None or mask_mod is not None or any(
      structure[name] is not None for name in ("key_value_seq_lengths", "query_segment_ids"))


def dot_product_attention(query, key, value, bias=None, mask=None, broadcast_dropout: bool = True,
                          dropout_rng=None, dropout_rate: float = 0.0,
                          deterministic: bool = False, dtype=None, precision=None, module=None,
                          force_fp32_for_softmax: bool = False, einsum_dot_general=None,
                          qk_attn_weights_einsum=None, attn_weights_value_einsum=None,
                          promote_dtype=None, *, scale: float | None = None,
                          is_causal: bool = False, query_seq_lengths=None,
                          key_value_seq_lengths=None,
                          local_window_size: int | tuple[int, int] | None = None,
                          logits_soft_cap: float | None = None,
                          query_segment_ids=None, key_segment_ids=None,
                          return_weights: bool = False, return_residual: bool = False,
                          implementation: str | None = None, empty_rows: str = "mean",
                          score_mod=None, mask_mod=None, block_mask=None, sinks=None,
                          normalizer: str = "softmax", sigmoid_bias: float | None = None,
                          return_logits: bool = False, hooks: reference.Hooks | None = None):
  r"""Scaled dot-product attention, softmax(Q K^T * scale + bias) V, per head.

  A superset of ``jax.nn.dot_product_attention`` and of flax's ``dot_product_attention`` (Linen
  and NNX): every argument either takes keeps its name, position and meaning, so it can replace
  them and serve as the ``attention_fn`` of flax's modules. Of flax's product arguments
  (``einsum_dot_general``, ...) only None is served; ``force_fp32_for_softmax`` is accepted (the
  softmax is float32 or wider anyway); ``module``: sow the weights there, as flax does.

  Args:
    query: [..., T, N, H].
    key: [..., S, K, H]; N a multiple of K (grouped-query attention: query head n reads
      key/value head n // (N // K), by grouping the queries).
    value: [..., S, K, H_v].
    bias: optional additive logits broadcastable to [..., N, T, S].
    mask: optional, broadcastable to [..., N, T, S]: attend where True (or nonzero, flax's float
      masks). Boolean is the fast path.
    dropout_rate: on the weights, with flax's masks for the same ``dropout_rng``, one [T, S] mask
      for the batch and heads with ``broadcast_dropout``; off when ``deterministic``.
    dtype, precision, promote_dtype: as flax's (the cast of query, key and value; the
      precision of the products).
    scale: multiplies Q K^T; None means 1 / sqrt(H). Any float is allowed.
    is_causal: query t attends only to keys s <= t (top-left aligned, as jax.nn).
    query_seq_lengths, key_value_seq_lengths: optional int [...]: rows t >= length give zeros,
      keys s >= length are not attended to.
    local_window_size: (left, right) or w = (w, w): query t sees keys t - left <= s <= t + right.
    logits_soft_cap: c > 0: the logits become c * tanh(scale * Q K^T / c) before bias and mask.
    query_segment_ids, key_segment_ids: int [..., T] and [..., S], both or neither: attend only
      where the ids are equal (packed examples).
    return_weights: also return the weights [..., N, T, S] (float32, before dropout).
    return_residual: also return each row's log-sum-exp [..., T, N] (float32, -inf on a row
      with nothing to attend to, no gradient).
    implementation: "reference", "xla" (jax.nn's), "chunked" (blockwise, memory linear in T and
      S), "cudnn", "pallas_tpu", "pallas_gpu" (score and mask functions fused, on NVIDIA
      GPUs) or None (``select_implementation``); TRANSFORMS says which
      autodiff modes each supports.
    empty_rows: what a row with no key returns: "mean" (as jax.nn and flax: uniform weights)
      or "zero". With ``sinks`` or the sigmoid such a row is zeros. Gradients stay finite.
    score_mod: ``score_mod(score, batch, head, q_idx, kv_idx) -> score`` (FlexAttention's),
      written for scalars, applied after the soft cap and bias, before the masks; arrays it
      closes over receive gradients.
    mask_mod: ``mask_mod(batch, head, q_idx, kv_idx) -> bool``: attend where True.
    block_mask: a ``make_block_mask`` result for this T and S, carrying its mask_mod: the
      chunked kernel skips its empty blocks and its full ones skip the mask_mod.
    sinks: [N] logits added to each row's softmax denominator (zeros: softmax-off-by-one);
      included in the log-sum-exp, with gradients.
    normalizer: "softmax" or "sigmoid": weights sigmoid(logit + sigmoid_bias) (None: -log(S)),
      unnormalised (:ref:`Ramapuram et al. 2024 <ref-ramapuram2024>`).
    return_logits: also return the logits [..., N, T, S] (float32, after the soft cap, bias and
      score_mod, before the mask), after the weights; only "reference" forms them.
    hooks: a head variant's hooks on the maps (``reference.Hooks``, ``Variant.hooks``): only
      "reference" serves them; a row with no key then gives zeros.

  Returns:
    [..., T, N, H_v] in the dtype of ``query``, followed by the weights and the residual when
    asked for (a tuple then). Malformed shapes or dtypes, or an implementation that cannot serve
    the call, raise ValueError at trace time.

  Example:
    >>> q = k = v = jnp.ones((2, 16, 4, 8))  # (B, T, N, H)
    >>> dot_product_attention(q, k, v, is_causal=True).shape
    (2, 16, 4, 8)
    >>> out, lse = dot_product_attention(q, k, v, local_window_size=(4, 0), return_residual=True)
  """
  _checks.refuse_unserved(einsum_dot_general=einsum_dot_general,
                          qk_attn_weights_einsum=qk_attn_weights_einsum,
                          attn_weights_value_einsum=attn_weights_value_einsum)
  del force_fp32_for_softmax  # the softmax is float32 or wider whatever it says
  if empty_rows not in EMPTY_ROWS:
    raise ValueError(f"empty_rows must be one of {EMPTY_ROWS}, got {empty_rows!r}.")
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  if promote_dtype is not None:
    query, key, value = promote_dtype((query, key, value), dtype=dtype)
  elif dtype is not None:
    query, key, value = (x.astype(dtype) for x in (query, key, value))
  _checks.check_qkv(query, key, value, folded=hooks is not None)
  q_len, num_heads, head_dim = query.shape[-3:]
  kv_len = key.shape[-3]
  mask, bias, structure = _checks.attention_inputs(query, key, mask, bias, num_heads, dict(
      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids, key_segment_ids=key_segment_ids))
  window = _checks.local_window(local_window_size)
  logits_soft_cap = _checks.soft_cap(logits_soft_cap)
  sinks = None if sinks is None else jnp.asarray(sinks)
  _checks.check_custom(num_heads, sinks=sinks, normalizer=normalizer,
                       return_residual=return_residual, hooks=hooks)
  mask_mod = mods_lib.check_block_mask(block_mask, mask_mod, math.prod(query.shape[:-3]),
                                       num_heads, q_len, kv_len)
  dropout_rate = _checks.dropout(dropout_rate, dropout_rng, deterministic)
  want_weights = return_weights or module is not None
  if not _can_empty_rows(mask, structure, window, mask_mod) or (
      sinks is not None or normalizer == "sigmoid" or hooks is not None):
    empty_rows = "zero"  # no row can be empty, or an empty row is zeros (sink, sigmoid, hooks)
  custom = dict(score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask, sinks=sinks,
                normalizer=normalizer)
  name = select_implementation(query, key, value, bias, mask, dropout_rate=dropout_rate,
                               return_weights=want_weights, return_residual=return_residual,
                               logits_soft_cap=logits_soft_cap, implementation=implementation,
                               return_logits=return_logits, hooks=hooks, **structure, **custom)
  scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
  custom.update(sigmoid_bias=sigmoid_bias, hooks=hooks)
  with default_precision(precision):
    result = _run(name, query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                  window=window, logits_soft_cap=logits_soft_cap, dropout_rate=dropout_rate,
                  dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
                  return_weights=want_weights, return_logits=return_logits,
                  return_residual=return_residual, empty_rows=empty_rows, structure=structure,
                  custom=custom)
  output, *extras = result if isinstance(result, tuple) else (result,)
  if module is not None:
    _sow(module, extras[0].astype(query.dtype))
    if not return_weights:
      extras = extras[1:]
  return (output, *extras) if extras else output


def _run(name, query, key, value, bias, mask, *, scale, is_causal, window, logits_soft_cap,
         dropout_rate, dropout_rng, broadcast_dropout, return_weights, return_logits,
         return_residual, empty_rows, structure, custom):
  """The named implementation on validated arguments: (output, weights?, residual?) or output.
  ``custom``: score_mod, mask_mod, block_mask, sinks, normalizer and sigmoid_bias."""
  if name == "pallas_gpu":  # the structure as mods, in the kernel
    return pallas_gpu.pallas_gpu_attention(
        query, key, value, mask, scale=scale, is_causal=is_causal, local_window_size=window,
        logits_soft_cap=logits_soft_cap, return_residual=return_residual, empty_rows=empty_rows,
        score_mod=custom["score_mod"], mask_mod=custom["mask_mod"],
        block_mask=custom["block_mask"], **structure)
  if name == "chunked":  # the structure stays implicit, so that whole blocks can be skipped
    return chunked.chunked_attention(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal,
        local_window_size=window, logits_soft_cap=logits_soft_cap,
        return_residual=return_residual, empty_rows=empty_rows, **structure,
        **{name: value for name, value in custom.items() if name != "hooks"})
  q_len, kv_len = query.shape[-3], key.shape[-3]
  mask = structure_mask(mask, q_len, kv_len, local_window_size=window, **structure)
  score_mod, allowed = mods_lib.dense(custom["score_mod"], custom["mask_mod"], query.dtype,
                                      query.shape[:-3], query.shape[-2], q_len, kv_len)
  mask = masks_lib.combine_masks(mask, allowed)  # allowed: [..., N, T, S] or None
  if name in _KERNELS:
    options = {"return_residual": True} if return_residual else {}
    result = _KERNELS[name](query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                            **options)
  else:
    result = reference.reference_attention(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal,
        logits_soft_cap=logits_soft_cap, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
        broadcast_dropout=broadcast_dropout, return_weights=return_weights,
        return_logits=return_logits, return_residual=return_residual, score_mod=score_mod,
        sinks=custom["sinks"], normalizer=custom["normalizer"], hooks=custom["hooks"],
        sigmoid_bias=mods_lib.sigmoid_bias(custom["sigmoid_bias"], kv_len))
  if empty_rows == "zero":
    return result
  output, *extras = result if isinstance(result, tuple) else (result,)
  has_key = masks_lib.rows_with_keys(mask, q_len, kv_len, is_causal=is_causal)  # [..., T, N]
  lengths = structure["query_seq_lengths"]
  query_valid = None if lengths is None else masks_lib.lengths_to_valid(lengths, q_len)
  weights = extras[0] if return_weights else None
  output, weights = masks_lib.uniform_empty_rows(output, has_key, value, weights, query_valid)
  extras = [weights] + extras[1:] if return_weights else extras
  return (output, *extras) if extras else output
