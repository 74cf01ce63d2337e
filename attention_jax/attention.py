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
from attention_jax import pallas_tpu
from attention_jax import reference
from attention_jax import xla

#: The names ``implementation=`` takes.
IMPLEMENTATIONS = ("reference", "xla", "chunked", "cudnn", "pallas_tpu")

#: Accelerator kernels run on one backend only; the other implementations run everywhere.
REQUIRED_BACKEND = {"cudnn": "gpu", "pallas_tpu": "tpu"}

#: What each implementation supports under JAX's transformations, beyond jit, vmap, grad, remat,
#: scan, shard_map and sharded jit, which all of them do.
TRANSFORMS = {
    "reference": "forward and reverse mode (jvp, jacfwd, hessian)",
    "xla": "forward and reverse mode (jvp, jacfwd, hessian)",
    "chunked": "reverse mode and hessian (a custom VJP); jvp and jacfwd raise ValueError",
    "cudnn": "reverse mode only (jax's cuDNN custom VJP)",
    "pallas_tpu": "reverse mode only (the kernel's custom VJP)",
}


def _chunked_unsupported_reason(query, key, value, request: _checks.Request) -> str | None:
  del query, key, value
  if request.dropout_rate > 0.0:
    return "chunked attention has no attention dropout"
  if request.return_weights:
    return "chunked attention never forms the weights, so it cannot return them"
  return None


_UNSUPPORTED_REASON = {
    "reference": lambda *args: None,  # the formula serves every request
    "xla": xla.unsupported_reason,
    "chunked": _chunked_unsupported_reason,
    "cudnn": cudnn.unsupported_reason,
    "pallas_tpu": pallas_tpu.unsupported_reason,
}


def unsupported_reason(name, query, key, value, request: _checks.Request) -> str | None:
  """Why implementation ``name`` cannot serve this request (on ``request.backend``), or None if
  it can."""
  required = REQUIRED_BACKEND.get(name)
  if required is not None and request.backend != required:
    return f"{name!r} runs only on the {required} backend, and this one is {request.backend}"
  return _UNSUPPORTED_REASON[name](query, key, value, request)


#: On CPU, blockwise attention from this length on; below it the reference formula, whose
#: head-major einsums beat jax.nn's [B, T, N, H] ones. The measurements behind the threshold:
#: docs/performance.md, "Where the defaults come from".
CHUNKED_MIN_LENGTH_CPU = 256

#: Accelerator kernels are chosen automatically only on the architectures where they have been
#: run against the float64 reference and timed: for cuDNN, CUDA compute capabilities (Hopper, 9.0,
#: measured on an H100 and an H200 against torch's SDPA and JAX's Pallas Triton kernel:
#: docs/performance.md), so that every GPU of that architecture (H100, H200, GH200) gets it;
#: for the Pallas TPU kernel, TPU device kinds by prefix. The Pallas TPU flash kernel has not run
#: on a TPU yet, so on TPU the automatic choice is "xla"; it stays available by name (not on TPU
#: v2/v3, where it fails: jax issue 18595).
MEASURED_ON = {"cudnn": ("9.0",), "pallas_tpu": ()}

#: The compute capability of NVIDIA GPUs by device kind (prefix), for when only the kind is known
#: (a question asked off the GPU, or a device that does not report its capability).
COMPUTE_CAPABILITY = {
    "NVIDIA H100": "9.0", "NVIDIA H200": "9.0", "NVIDIA GH200": "9.0", "NVIDIA H800": "9.0",
    "NVIDIA B200": "10.0", "NVIDIA GB200": "10.0", "NVIDIA A100": "8.0", "NVIDIA A10": "8.6",
    "NVIDIA L4": "8.9", "NVIDIA L40": "8.9", "Tesla T4": "7.5", "Tesla V100": "7.0",
}

#: On GPU, where cuDNN cannot serve a call (float32, head dims it lacks), XLA's attention is faster
#: than the chunked kernel's loops but materialises the [..., N, T, S] logits and probabilities.
#: Above this many bytes of float32 logits the chunked kernel (memory linear in T) takes over, so
#: that one call stays within a 16 GB GPU. The measurements behind the threshold:
#: docs/performance.md, "Where the defaults come from".
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
    return ("cudnn",) * _measured("cudnn", arch) + portable + ("reference",)
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

  ``call``: the call's other arguments, as ``dot_product_attention`` takes them, so that a call
  can be asked about as it is written: ``deterministic=True`` switches dropout off,
  ``module`` asks for the weights, as there, and ``score_mod``, ``mask_mod``, ``block_mask``,
  ``sinks`` and ``normalizer="sigmoid"`` rule out the kernels that cannot serve them; the
  others (causality, windows, lengths, segment ids, dtype, ...) do not change the choice. A
  name that function does not take raises TypeError.

  ``implementation=None`` picks the first implementation that can serve the request from a list
  per backend (``backend`` defaults to ``jax.default_backend()``, ``device_kind`` to the kind of
  its first device, e.g. "NVIDIA H100 80GB HBM3" or "TPU v4", and on GPU ``compute_capability``
  to that device's, e.g. "9.0", or else the one COMPUTE_CAPABILITY gives for the kind):

  - cpu: "chunked" when T or S >= CHUNKED_MIN_LENGTH_CPU, else "reference" (both measured
    faster than jax.nn here);
  - gpu: "cudnn" on the architectures in MEASURED_ON (float16/bfloat16, head_dim a multiple of 8
    up to 128, value shaped like key), else "xla" while the float32 logits would take at most
    XLA_MAX_LOGITS_BYTES_GPU, else "chunked";
  - tpu: "pallas_tpu" on the TPUs in MEASURED_ON (none yet), else "xla";
  - "chunked" wherever "xla" cannot serve the call (a score_mod, sinks, the sigmoid normaliser),
    so that memory stays linear in T; a mask_mod goes to "xla" or "chunked" as on GPU (cuDNN and
    the Pallas kernel take it only as a dense mask, when named);
  - and "reference" when none of these can (attention dropout, returned weights).

  A named implementation that cannot serve the request raises ``ValueError`` with the reason;
  nothing falls back silently. Shapes are enough: pass ``jax.ShapeDtypeStruct`` objects to ask
  what a call would run, and ``backend="gpu", device_kind="NVIDIA H200"`` (or
  ``compute_capability="9.0"``) to ask what it would run there.

  >>> q = k = v = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  >>> select_implementation(q, k, v, return_weights=True)
  'reference'
  >>> select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA H200")
  'cudnn'
  >>> select_implementation(q, k, v, backend="gpu", compute_capability="8.0")  # not measured
  'xla'
  """
  del bias, mask  # every implementation serves any mask and bias
  unknown = sorted(set(call) - set(inspect.signature(dot_product_attention).parameters))
  if unknown:
    raise TypeError(f"select_implementation() got arguments that dot_product_attention does not "
                    f"take: {unknown}.")
  dropout_rate = 0.0 if call.get("deterministic") else dropout_rate
  return_weights = return_weights or call.get("module") is not None
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
      sinks=call.get("sinks") is not None, normalizer=call.get("normalizer", "softmax"))
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


#: What a query row with no key to attend to returns (``empty_rows=``): "mean", as jax.nn and
#: flax (their masked logits are all equal, so the softmax is uniform and the row is the mean of
#: the values over all S keys, with uniform weights), or "zero" (zeros and zero weights).
#: Rows past ``query_seq_lengths`` are zeros either way, as in jax.nn.
EMPTY_ROWS = ("mean", "zero")

#: flax's arguments that choose how products are computed; we compute them our own way and refuse
#: any other choice in one line rather than ignore it.
_FLAX_PRODUCT_ARGUMENTS = ("einsum_dot_general", "qk_attn_weights_einsum",
                           "attn_weights_value_einsum")


def matmul_precision(precision) -> str | None:
  """flax's ``precision`` (a lax.Precision, its name, or a pair) as the name that
  ``jax.default_matmul_precision`` takes, for the products inside attention; None stays None.

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
  """Sows the weights as flax's attention functions do with ``module=``: in "intermediates" for a
  Linen module, as an ``nnx.Intermediate`` for an NNX one."""
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
                          normalizer: str = "softmax", sigmoid_bias: float | None = None):
  r"""Scaled dot-product attention, softmax(Q K^T * scale + bias) V, per head.

  A superset of ``jax.nn.dot_product_attention`` and of flax's ``dot_product_attention`` (Linen
  and NNX): every argument either takes keeps its name, position and meaning, so it can replace
  them in a call and serve as the ``attention_fn`` of flax's attention modules.

  Args:
    query: [..., T, N, H].
    key: [..., S, K, H]; N must be a multiple of K (grouped-query attention: query head n reads
      key/value head n // (N // K); the queries are grouped, keys and values never copied).
    value: [..., S, K, H_v].
    bias: optional additive logits broadcastable to [..., N, T, S]; -inf means "do not attend".
    mask: optional, broadcastable to [..., N, T, S]: attend where True or, for a mask of another
      dtype (flax's ``make_attention_mask`` gives float32), where nonzero. Boolean is the fast path.
    broadcast_dropout: one dropout mask [T, S] shared by the batch and the heads (flax's default),
      or (False) one per weight.
    dropout_rng: a PRNG key for attention dropout.
    dropout_rate: attention dropout on the weights; needs ``dropout_rng`` unless deterministic.
      The masks are flax's for the same key: bernoulli(dropout_rng, 1 - rate, shape).
    deterministic: no dropout (flax's switch).
    dtype: the dtype the query, key and value are cast to (None: as they come).
    precision: of the matrix products (a ``jax.lax.Precision``, its name or a pair), as flax's.
    module: a Linen or NNX module in which to sow the weights [..., N, T, S] as
      "attention_weights", as flax does (Linen: the "intermediates" collection).
    force_fp32_for_softmax: accepted for flax's signature; the softmax always runs in float32 or
      wider here, which is what True asks for.
    einsum_dot_general, qk_attn_weights_einsum, attn_weights_value_einsum: flax's ways to replace
      the products; only None is served (anything else raises ValueError naming it).
    promote_dtype: flax NNX's ``(arrays, dtype=) -> arrays`` applied to (query, key, value).
    scale: multiplies Q K^T; None means 1 / sqrt(H). Any float is allowed.
    is_causal: query t attends only to keys s <= t (top-left aligned, as jax.nn).
    query_seq_lengths: optional int [...]: query rows t >= length attend to nothing (zeros).
    key_value_seq_lengths: optional int [...]: keys s >= length are not attended to.
    local_window_size: optional (left, right) or an int w = (w, w): query t attends to keys
      t - left <= s <= t + right.
    logits_soft_cap: optional c > 0: the logits become c * tanh(scale * Q K^T / c) before the
      bias and the mask (Gemma 2).
    query_segment_ids, key_segment_ids: optional int [..., T] and [..., S], both or neither:
      attend only where the ids are equal (packed examples).
    return_weights: also return the softmax weights [..., N, T, S] (float32, before dropout).
    return_residual: also return the log-sum-exp of each row's logits, [..., T, N] (float32,
      -inf for a row with nothing to attend to, without gradient), as jax.nn names it.
    implementation: "reference" (the formula), "xla" (jax.nn.dot_product_attention), "chunked"
      (blockwise, memory linear in T and S; it skips key blocks that the causal mask, the window,
      the lengths or the segment ids rule out; block sizes via ``chunked_attention``), "cudnn"
      (cuDNN flash attention on NVIDIA GPUs), "pallas_tpu" (the Pallas flash kernel on TPU) or
      None (automatic, see ``select_implementation``). TRANSFORMS says which autodiff modes each
      supports.
    empty_rows: what a query row with no key to attend to returns: "mean" (default, as jax.nn
      and flax: the mean of the values over all keys, uniform weights) or "zero" (zeros and zero
      weights). Rows past ``query_seq_lengths`` are zeros either way. Gradients stay finite.
      With ``sinks`` or sigmoid attention such a row is zeros (all weight on the sink, or none).
    score_mod: optional ``score_mod(score, batch, head, q_idx, kv_idx) -> score``, PyTorch
      FlexAttention's: written for scalars (int32 indices; ``batch`` the flattened batch index,
      ``head`` the query head), applied to every logit after the soft cap and the bias and
      before the masks. Arrays it closes over receive gradients.
    mask_mod: optional ``mask_mod(batch, head, q_idx, kv_idx) -> bool``: attend where True,
      combined with every other mask.
    block_mask: optional ``BlockMask`` from ``make_block_mask`` for this T and S: it carries its
      mask_mod, and the chunked kernel skips its empty blocks and does not evaluate the
      mask_mod on its full ones (the kernel's blocks are the block mask's).
    sinks: optional [N] logits, one per query head, added to each row's softmax denominator
      (exp(sink) / (exp(sink) + sum_s exp(logit_s)) is the weight no key gets); zeros give
      softmax-off-by-one. Included in the returned log-sum-exp; they receive gradients.
    normalizer: "softmax" (default) or "sigmoid": weights sigmoid(logit + b), 0 where masked,
      with no normalisation over the row (:ref:`Ramapuram et al. 2024 <ref-ramapuram2024>`).
    sigmoid_bias: b for the sigmoid; None means -log(S).

  Returns:
    [..., T, N, H_v] in the dtype of ``query``, followed by the weights and the residual when
    asked for (a tuple then). The softmax runs in float32 (at least) with the row max subtracted.

  Raises:
    ValueError: at trace time, for malformed shapes or dtypes, or an implementation that cannot
      serve the request.

  Example:
    >>> q = k = v = jnp.ones((2, 16, 4, 8))  # (B, T, N, H)
    >>> dot_product_attention(q, k, v, is_causal=True).shape
    (2, 16, 4, 8)
    >>> out, lse = dot_product_attention(q, k, v, local_window_size=(4, 0), return_residual=True)
  """
  for name, argument in zip(_FLAX_PRODUCT_ARGUMENTS, (einsum_dot_general, qk_attn_weights_einsum,
                                                      attn_weights_value_einsum)):
    if argument is not None:
      raise ValueError(f"{name}={argument!r} is not served: attention_jax computes its own "
                       f"products (precision= sets their precision); leave {name}=None.")
  del force_fp32_for_softmax  # the softmax is float32 or wider whatever it says
  if empty_rows not in EMPTY_ROWS:
    raise ValueError(f"empty_rows must be one of {EMPTY_ROWS}, got {empty_rows!r}.")
  query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
  if promote_dtype is not None:
    query, key, value = promote_dtype((query, key, value), dtype=dtype)
  elif dtype is not None:
    query, key, value = (x.astype(dtype) for x in (query, key, value))
  mask = None if mask is None else jnp.asarray(mask)
  if mask is not None and mask.dtype != jnp.bool_ and (
      jnp.issubdtype(mask.dtype, jnp.number)):
    mask = mask != 0  # flax's reading of a float or int mask: nonzero = attend
  bias = None if bias is None else jnp.asarray(bias)
  structure = {name: None if array is None else jnp.asarray(array) for name, array in (
      ("query_seq_lengths", query_seq_lengths), ("key_value_seq_lengths", key_value_seq_lengths),
      ("query_segment_ids", query_segment_ids), ("key_segment_ids", key_segment_ids))}
  _checks.check_qkv(query, key, value)
  q_len, num_heads, head_dim = query.shape[-3:]
  kv_len = key.shape[-3]
  target = query.shape[:-3] + (num_heads, q_len, kv_len)  # [..., N, T, S]
  _checks.check_mask_and_bias(mask, bias, target)
  _checks.check_structure(query, key, **structure)
  window = _checks.local_window(local_window_size)
  logits_soft_cap = _checks.soft_cap(logits_soft_cap)
  sinks = None if sinks is None else jnp.asarray(sinks)
  _checks.check_custom(num_heads, sinks=sinks, normalizer=normalizer,
                       return_residual=return_residual)
  mask_mod = mods_lib.check_block_mask(block_mask, mask_mod, math.prod(query.shape[:-3]),
                                       num_heads, q_len, kv_len)
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  dropout_rate = 0.0 if deterministic else dropout_rate
  if dropout_rate > 0.0 and dropout_rng is None:
    raise ValueError(f"dropout_rate={dropout_rate} needs a dropout_rng (a jax.random key), or "
                     "deterministic=True.")
  want_weights = return_weights or module is not None
  if not _can_empty_rows(mask, structure, window, mask_mod) or (
      sinks is not None or normalizer == "sigmoid"):
    empty_rows = "zero"  # no row can be empty, or an empty row is zeros (sink, sigmoid)
  custom = dict(score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask, sinks=sinks,
                normalizer=normalizer)
  name = select_implementation(query, key, value, dropout_rate=dropout_rate,
                               return_weights=want_weights, return_residual=return_residual,
                               logits_soft_cap=logits_soft_cap, implementation=implementation,
                               **custom)
  scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
  custom["sigmoid_bias"] = sigmoid_bias
  with default_precision(precision):
    result = _run(name, query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                  window=window, logits_soft_cap=logits_soft_cap, dropout_rate=dropout_rate,
                  dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
                  return_weights=want_weights, return_residual=return_residual,
                  empty_rows=empty_rows, structure=structure, custom=custom)
  output, *extras = result if isinstance(result, tuple) else (result,)
  if module is not None:
    _sow(module, extras[0].astype(query.dtype))
    if not return_weights:
      extras = extras[1:]
  return (output, *extras) if extras else output


def _run(name, query, key, value, bias, mask, *, scale, is_causal, window, logits_soft_cap,
         dropout_rate, dropout_rng, broadcast_dropout, return_weights, return_residual,
         empty_rows, structure, custom):
  """The named implementation on validated arguments: (output, weights?, residual?) or output.
  ``custom``: score_mod, mask_mod, block_mask, sinks, normalizer and sigmoid_bias."""
  if name == "chunked":  # the structure stays implicit, so that whole blocks can be skipped
    return chunked.chunked_attention(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal,
        local_window_size=window, logits_soft_cap=logits_soft_cap,
        return_residual=return_residual, empty_rows=empty_rows, **structure, **custom)
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
        return_residual=return_residual, score_mod=score_mod, sinks=custom["sinks"],
        normalizer=custom["normalizer"],
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
