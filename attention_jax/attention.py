"""dot_product_attention: one contract, several implementations, chosen by name.

Shape letters: T query length, S key/value length, N query heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax import _checks
from attention_jax import block_masks
from attention_jax import chunked
from attention_jax import cudnn
from attention_jax import masks as masks_lib
from attention_jax import mods as mods_lib
from attention_jax import pallas_gpu
from attention_jax import pallas_tpu
from attention_jax import reference
from attention_jax import xla

#: The parts of a call that not every implementation serves (beyond attention with a mask and a
#: bias), each with the arguments that ask for it and how an implementation that lacks it says so.
PARTS = {
    "dropout": ("dropout_rate", "has no attention dropout"),
    "weights": ("return_weights, module, return_logits",
                "never forms the weights, so it cannot return them"),
    "residual": ("return_residual", "does not return the log-sum-exp"),
    "max_scores": ("return_max_scores", "does not return the rows' largest scores"),
    "soft_cap": ("logits_soft_cap", "has no logits soft cap"),
    "score_mod": ("score_mod", "cannot serve score_mod"),
    "mask_mod": ("mask_mod, block_mask", "cannot serve mask_mod"),
    "sinks": ("sinks", "cannot serve sinks"),
    "sigmoid": ('normalizer="sigmoid"', 'cannot serve normalizer="sigmoid"'),
    "hooks": ("hooks", "cannot serve hooks (a head variant's maps)"),
    "bias": ("an array bias", "takes a bias only written as a score_mod (it would give an array "
             "bias no gradient)"),
}


@dataclasses.dataclass(frozen=True)
class Request:
  """One call of ``dot_product_attention``, validated, as the dispatch and every implementation
  receive it, and where it runs (``backend``, ``device_kind``, ``compute_capability`` as jax names
  them, None when unknown)."""
  bias: Any = None
  mask: Any = None
  structure: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(_checks.STRUCTURE))
  window: tuple | None = None  # (left, right)
  is_causal: bool = False
  scale: float = 1.0
  logits_soft_cap: float | None = None
  dropout_rate: float = 0.0
  dropout_rng: Any = None
  broadcast_dropout: bool = True
  return_weights: bool = False  # also to sow them into a module
  return_logits: bool = False
  return_residual: bool = False
  return_max_scores: bool = False
  empty_rows: str = "mean"  # dot_product_attention's default
  score_mod: Any = None
  mask_mod: Any = None  # its own or the block mask's
  block_mask: Any = None
  sinks: Any = None
  normalizer: str = "softmax"
  sigmoid_bias: float | None = None
  hooks: reference.Hooks | None = None
  backend: str | None = None
  device_kind: str | None = None
  compute_capability: str | None = None

  @property
  def parts(self) -> tuple[str, ...]:
    """The PARTS this call asks for, in PARTS' order."""
    asked = dict(dropout=self.dropout_rate > 0.0, weights=self.return_weights or self.return_logits,
                 residual=self.return_residual, max_scores=self.return_max_scores,
                 soft_cap=self.logits_soft_cap is not None,
                 score_mod=self.score_mod is not None,
                 mask_mod=self.mask_mod is not None or self.block_mask is not None,
                 sinks=self.sinks is not None, sigmoid=self.normalizer == "sigmoid",
                 hooks=self.hooks is not None, bias=self.bias is not None)
    return tuple(part for part in PARTS if asked[part])


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One implementation, all that is known of it: the dispatch, the refusals and the support
  table of docs/guides/implementations.md are made from these records."""
  name: str
  title: str  # how its refusals name it
  about: str  # what it is (MyST, for the support table)
  transforms: str  # of jvp, jacfwd, hessian, vmap and shard_map, which (all do jit, grad, remat, scan)
  run: Callable  # (query, key, value, request) -> output, or a tuple with what the request asks
  serves: tuple[str, ...] = tuple(PARTS)  # the PARTS it serves
  named_only: tuple[str, ...] = ()  # PARTS it serves when named, never chosen for automatically
  backend: str | None = None  # the one backend it runs on; None: all of them
  #: the architectures (``architecture``'s, by prefix) where it has been run against the float64
  #: reference and timed (docs/performance.md), so that it is chosen automatically there
  measured_on: tuple[str, ...] = ()
  #: the PARTS for which the automatic choice takes it there, the calls it was measured on and
  #: won (left empty, any call it serves)
  chosen_for: tuple[str, ...] = ()
  check: Callable | None = None  # (query, key, value, request) -> why its shape, dtype or device
  # rules it out, or None


def unsupported_reason(name, query, key, value, request: Request) -> str | None:
  """Why implementation ``name`` cannot serve ``request`` (on ``request.backend``), or None if it
  can: its backend, the first of the request's PARTS it does not serve, then its own check."""
  kernel = KERNELS[name]
  if kernel.backend is not None and request.backend != kernel.backend:
    return f"{name!r} runs only on the {kernel.backend} backend, and this one is {request.backend}"
  if unserved := [part for part in request.parts if part not in kernel.serves]:
    return f"{kernel.title} {PARTS[unserved[0]][1]}"
  return kernel.check(query, key, value, request) if kernel.check else None


#: On CPU, blockwise attention from this length on, below it the reference formula
#: (docs/performance.md, "Where the defaults come from").
CHUNKED_MIN_LENGTH_CPU = 256

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
  """What Kernel.measured_on holds: on GPU the CUDA compute capability (given, else looked up from
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


def _automatic_order(query, key, backend: str, arch: str | None,
                     dropout: bool = False) -> tuple[str, ...]:
  """Implementations to try, fastest first, for this backend, architecture and shape: the
  accelerator kernels measured on ``arch``, then the portable ones (with ``dropout``, the
  reference, whose masks are flax's, before the blockwise kernel while the logits are small)."""
  measured = tuple(name for name, kernel in KERNELS.items() if kernel.backend == backend and (
      arch is not None and arch.startswith(kernel.measured_on)))
  if backend == "cpu":
    longest = max(query.shape[-3], key.shape[-3])
    return ("chunked", "reference") if longest >= CHUNKED_MIN_LENGTH_CPU else ("reference",)
  # "chunked" wherever "xla" cannot serve (a score_mod, sinks, sigmoid): memory linear in T
  logits_bytes = 4 * math.prod(query.shape[:-1]) * key.shape[-3]  # [..., T, N] x S float32
  small = logits_bytes <= XLA_MAX_LOGITS_BYTES_GPU
  if dropout and small:  # flax's masks where the dense weights fit
    return ("reference",) + measured + ("chunked",)
  large = backend == "gpu" and not small
  return measured + (("chunked", "xla") if large else ("xla", "chunked")) + ("reference",)


def _device(backend: str):
  """The first device of ``backend`` when it is the one JAX runs on, else None (unknown)."""
  return jax.devices()[0] if backend == jax.default_backend() else None


def _where(backend: str | None, device_kind: str | None, compute_capability: str | None):
  """backend (default: jax's), device_kind and compute_capability (default: those of its first
  device when JAX runs on it; a kind or capability given asks about another device)."""
  backend = jax.default_backend() if backend is None else backend
  device = _device(backend)
  if device is not None and device_kind is None and compute_capability is None:
    device_kind = device.device_kind
    compute_capability = getattr(device, "compute_capability", None)
  return dict(backend=backend, device_kind=device_kind, compute_capability=compute_capability)


def _choose(query, key, value, request: Request, implementation: str | None,
            passed_over: dict | None = None) -> Kernel:
  """The kernel that serves ``request``: ``implementation``, or the first of the automatic order
  that can (why each one before it could not goes into ``passed_over``, {name: reason}); a named
  one that cannot raises ValueError with the reason."""
  passed_over = {} if passed_over is None else passed_over
  if implementation is None:
    arch = architecture(request.backend, request.device_kind, request.compute_capability)
    for name in _automatic_order(query, key, request.backend, arch, request.dropout_rate > 0.0):
      kernel, parts = KERNELS[name], set(request.parts)
      if kernel.chosen_for and not set(kernel.chosen_for) & parts:
        passed_over[name] = f"chosen automatically only for {', '.join(kernel.chosen_for)}"
      elif named := set(kernel.named_only) & parts:
        passed_over[name] = f"serves {', '.join(sorted(named))} only when named"
      elif (reason := unsupported_reason(name, query, key, value, request)) is not None:
        passed_over[name] = reason
      else:
        return kernel
  if implementation not in KERNELS:
    raise ValueError(
        f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}.")
  reason = unsupported_reason(implementation, query, key, value, request)
  if reason is not None:
    raise ValueError(f"implementation={implementation!r} cannot serve this call: {reason}; "
                     "use implementation=None to pick one that can.")
  return KERNELS[implementation]


def select_implementation(query, key, value, *args, backend: str | None = None,
                          device_kind: str | None = None, compute_capability: str | None = None,
                          explain: bool = False, **kwargs) -> str | tuple[str, dict[str, str]]:
  """The name of the implementation ``dot_product_attention`` runs for these arguments; with
  ``explain``, (name, {kernel passed over: why}) for the kernels tried before it.

  ``args`` and ``kwargs``: the call's other arguments, as ``dot_product_attention`` takes them
  (arrays or ``jax.ShapeDtypeStruct``; with ``dropout_rate`` the ``dropout_rng`` may be left out).
  The call is traced for shapes only, up to its choice: the same validation and the same request
  as the call itself. ``implementation=None`` picks the first kernel that can serve the request
  (KERNELS says what each serves), for ``backend`` (default ``jax.default_backend()``),
  ``device_kind`` and, on GPU, ``compute_capability`` (default: those of its first device, or
  COMPUTE_CAPABILITY's):

  - cpu: "chunked" when T or S >= CHUNKED_MIN_LENGTH_CPU, else "reference";
  - gpu: the kernels measured on this architecture (on Hopper "cudnn", then "pallas_gpu" for
    what ``Kernel.chosen_for`` names: score and mask functions, soft cap, row maxima), else
    "xla" while the float32 logits take at most XLA_MAX_LOGITS_BYTES_GPU, else "chunked";
  - tpu: "pallas_tpu" on the TPUs it was measured on (none yet), else "xla";
  - "chunked" wherever "xla" cannot serve (a score_mod, sinks, the sigmoid); a mask_mod never
    goes to "cudnn" or "pallas_tpu" unless named (``Kernel.named_only``);
  - dropout: "reference" where its dense weights are small (below CHUNKED_MIN_LENGTH_CPU on
    CPU, within XLA_MAX_LOGITS_BYTES_GPU elsewhere), so the masks are flax's
    (``bernoulli(dropout_rng, 1 - rate, shape)``) and a drop-in reproduces flax's numbers; above
    that "chunked" (the fused kernel on Hopper when the call has score or mask functions), whose
    counter-based masks (the same in both) keep memory linear in T (the same keep rate, other
    entries);
  - "reference" when none of these can (returned weights, a head variant's hooks).

  A kernel the automatic choice passes over (a mod the fused kernel's interpreter refuses or
  fails on, ...) is named with its reason by ``explain``. A named implementation that cannot
  serve raises ``ValueError`` with the reason; nothing falls back silently; an argument
  ``dot_product_attention`` does not take raises ``TypeError``.

  >>> q = k = v = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  >>> select_implementation(q, k, v, return_weights=True)
  'reference'
  >>> select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA H200")
  'cudnn'
  >>> select_implementation(q, k, v, backend="gpu", compute_capability="8.0")  # not measured
  'xla'
  >>> select_implementation(q, k, v, dropout_rate=0.1, backend="cpu")  # T = 512: linear memory
  'chunked'
  >>> select_implementation(q, k, v, backend="gpu", device_kind="NVIDIA H200", sinks=jnp.zeros(8),
  ...                       explain=True)
  ('chunked', {'cudnn': 'cuDNN flash attention cannot serve sinks', 'pallas_gpu': ...})
  """
  if kwargs.get("dropout_rate") and kwargs.get("dropout_rng") is None:
    kwargs["dropout_rng"] = jax.random.key(0)  # a stand-in: only its being there matters
  is_leaf = lambda x: not isinstance(x, (tuple, list, dict))  # noqa: E731 (modules, functions)
  leaves, tree = jax.tree.flatten((query, key, value, args, kwargs), is_leaf=is_leaf)
  traced = [i for i, leaf in enumerate(leaves)
            if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))]

  def call(*arrays):
    filled = list(leaves)
    for i, array in zip(traced, arrays):
      filled[i] = array
    q, k, v, more, named = jax.tree.unflatten(tree, filled)
    return dot_product_attention(q, k, v, *more, **named)

  token = _SELECTING.set(_where(backend, device_kind, compute_capability))
  try:
    jax.eval_shape(call, *(leaves[i] for i in traced))
  except _Chosen as chosen:
    return chosen.args if explain else chosen.args[0]
  finally:
    _SELECTING.reset(token)
  raise AssertionError("dot_product_attention returned without choosing")  # unreachable


class _Chosen(Exception):
  """How a call traced by select_implementation stops once it has chosen: _Chosen(name,
  {kernel passed over: why})."""


#: Where select_implementation asks about (``_where``'s dict) while it traces a call, else None.
_SELECTING: contextvars.ContextVar[dict | None] = contextvars.ContextVar("selecting", default=None)


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


#: What a query row with no key to attend to returns (``empty_rows=``), the default first: the
#: library's one list (``masks.EMPTY_ROWS``), applied by ``masks.fill_empty_rows`` on every path.
EMPTY_ROWS = masks_lib.EMPTY_ROWS

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
                          return_logits: bool = False, hooks: reference.Hooks | None = None,
                          return_max_scores: bool = False):
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
    dropout_rate: on the weights, one [T, S] mask for the batch and heads with
      ``broadcast_dropout``; off when ``deterministic``. The dense paths draw flax's masks for the
      same ``dropout_rng``, the blockwise kernels ("chunked", "pallas_gpu") counter-based ones of
      their own (``select_implementation`` says which a call gets).
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
      GPUs) or None (``select_implementation``); KERNELS says which
      autodiff modes each supports.
    empty_rows: what a row with no key returns: "mean" (as jax.nn and flax: uniform weights)
      or "zero", for every implementation (the kernels give zeros; this call applies "mean").
      With ``sinks``, the sigmoid or a variant's hooks such a row is zeros. Gradients stay
      finite.
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
    return_max_scores: also return each row's largest score [..., T, N] (float32: the largest
      logit after the soft cap, bias and score_mod among the keys it attends to, a sink
      included; -inf on a row with nothing to attend to; no gradient), torch's ``max_scores``.

  Returns:
    [..., T, N, H_v] in the dtype of ``query``, followed by the weights, the logits, the residual
    and the maximum scores, those asked for (a tuple then). Malformed shapes or dtypes, or an
    implementation that cannot serve the call, raise ValueError at trace time.

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
  masks_lib.check_empty_rows(empty_rows)
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
  sinks = None if sinks is None else jnp.asarray(sinks)
  _checks.check_custom(num_heads, sinks=sinks, normalizer=normalizer,
                       return_residual=return_residual or return_max_scores, hooks=hooks)
  mask_mod = block_masks.check_block_mask(block_mask, mask_mod, math.prod(query.shape[:-3]),
                                       num_heads, q_len, kv_len)
  if not _can_empty_rows(mask, structure, window, mask_mod) or (
      sinks is not None or normalizer == "sigmoid" or hooks is not None):
    empty_rows = "zero"  # no row can be empty, or an empty row is zeros (sink, sigmoid, hooks)
  request = Request(
      bias=bias, mask=mask, structure=structure, window=window, is_causal=is_causal,
      scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
      logits_soft_cap=_checks.soft_cap(logits_soft_cap),
      dropout_rate=_checks.dropout(dropout_rate, dropout_rng, deterministic),
      dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout,
      return_weights=return_weights or module is not None, return_logits=return_logits,
      return_residual=return_residual, return_max_scores=return_max_scores,
      empty_rows=empty_rows, score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask,
      sinks=sinks, normalizer=normalizer, sigmoid_bias=sigmoid_bias, hooks=hooks,
      **(_SELECTING.get() or _where(None, None, None)))
  passed_over = {}
  kernel = _choose(query, key, value, request, implementation, passed_over)
  if _SELECTING.get() is not None:
    raise _Chosen(kernel.name, passed_over)
  with default_precision(precision):
    result = kernel.run(query, key, value, request)
  output, *extras = result if isinstance(result, tuple) else (result,)
  if module is not None:
    _sow(module, extras[0].astype(query.dtype))
    if not return_weights:
      extras = extras[1:]
  return (output, *extras) if extras else output


def _blockwise(kernel):
  """Runs a blockwise kernel with the options both share (``empty_rows`` applied by the kernel
  function, through ``masks.blockwise_empty_rows``)."""
  def run(query, key, value, r: Request):
    return kernel(query, key, value, r, dict(
        scale=r.scale, is_causal=r.is_causal, local_window_size=r.window,
        logits_soft_cap=r.logits_soft_cap, return_residual=r.return_residual,
        score_mod=r.score_mod, mask_mod=r.mask_mod, block_mask=r.block_mask,
        return_max_scores=r.return_max_scores, dropout_rate=r.dropout_rate,
        dropout_rng=r.dropout_rng, broadcast_dropout=r.broadcast_dropout,
        empty_rows=r.empty_rows, **r.structure))
  return run


@_blockwise
def _pallas_gpu(query, key, value, r: Request, options):  # the structure as mods, in the kernel
  return pallas_gpu.pallas_gpu_attention(query, key, value, r.mask, **options)


@_blockwise
def _chunked(query, key, value, r: Request, options):  # whole blocks outside the structure skipped
  return chunked.chunked_attention(
      query, key, value, r.bias, r.mask, sinks=r.sinks, normalizer=r.normalizer,
      sigmoid_bias=r.sigmoid_bias, **options)


def _mean_rows(result, has_key, value, r: Request):
  """``empty_rows="mean"`` for the kernels run on one dense mask (``_dense``; the blockwise ones
  apply it themselves, masks.blockwise_empty_rows): a kernel's result (zeros on a row with no
  key) with jax.nn's answer there, the mean of the values (and uniform weights, if returned);
  ``has_key`` [..., T, N] says which rows have a key. Rows past ``query_seq_lengths`` stay
  zeros."""
  output, *extras = result if isinstance(result, tuple) else (result,)
  weights = extras[0] if r.return_weights else None
  output, weights = masks_lib.fill_empty_rows(output, has_key, value, r.empty_rows,
                                              r.structure["query_seq_lengths"], weights)
  extras = [weights] + extras[1:] if r.return_weights else extras
  return (output, *extras) if extras else output


def _reference(query, key, value, bias, mask, score_mod, r: Request):
  return reference.reference_attention(
      query, key, value, bias, mask, scale=r.scale, is_causal=r.is_causal,
      logits_soft_cap=r.logits_soft_cap, dropout_rate=r.dropout_rate, dropout_rng=r.dropout_rng,
      broadcast_dropout=r.broadcast_dropout, return_weights=r.return_weights,
      return_logits=r.return_logits, return_residual=r.return_residual,
      return_max_scores=r.return_max_scores, score_mod=score_mod,
      sinks=r.sinks, normalizer=r.normalizer, hooks=r.hooks,
      sigmoid_bias=mods_lib.sigmoid_bias(r.sigmoid_bias, key.shape[-3]))


def _fused(kernel):
  """A kernel that takes (query, key, value, bias, mask, *, scale, is_causal[, return_residual])
  in the signature of ``_reference``. These kernels keep no row maxima: with
  ``return_max_scores`` a second pass through the blockwise kernel gives them (its cost)."""
  def run(query, key, value, bias, mask, score_mod, r: Request):
    del score_mod  # never asked of these kernels
    options = {"return_residual": True} if r.return_residual else {}
    result = kernel(query, key, value, bias, mask, scale=r.scale, is_causal=r.is_causal,
                    **options)
    if not r.return_max_scores:
      return result
    largest = chunked.chunked_attention(query, key, value, bias, mask, scale=r.scale,
                                        is_causal=r.is_causal, return_max_scores=True,
                                        empty_rows="zero")[-1]
    return (*(result if isinstance(result, tuple) else (result,)), largest)
  return run


def _dense(kernel):
  """Runs ``kernel`` with the structure and the mods as one dense mask, then gives the empty rows
  what ``empty_rows`` asks."""
  def run(query, key, value, r: Request):
    q_len, kv_len = query.shape[-3], key.shape[-3]
    mask = structure_mask(r.mask, q_len, kv_len, local_window_size=r.window, **r.structure)
    score_mod, allowed = mods_lib.dense(r.score_mod, r.mask_mod, query.dtype, query.shape[:-3],
                                        query.shape[-2], q_len, kv_len)
    mask = masks_lib.combine_masks(mask, allowed)  # allowed: [..., N, T, S] or None
    result = kernel(query, key, value, r.bias, mask, score_mod, r)
    if r.empty_rows == "zero":
      return result
    has_key = masks_lib.rows_with_keys(mask, q_len, kv_len, is_causal=r.is_causal)  # [..., T, N]
    return _mean_rows(result, has_key, value, r)
  return run


_FLASH = ("residual", "mask_mod", "bias")  # causal, windows, lengths, segment ids are native too
_FORWARD_MODE = "jvp, jacfwd, hessian (and grad of a jvp), vmap, shard_map"
_REVERSE_ONLY = "vmap, shard_map; not jvp, jacfwd or hessian (reverse mode only: {})"

#: Every implementation, by the name ``implementation=`` takes.
KERNELS = {kernel.name: kernel for kernel in (
    Kernel("reference", "the reference formula",
           "the formula, with head-major einsums; serves every request", _FORWARD_MODE,
           _dense(_reference)),
    Kernel("xla", "jax.nn.dot_product_attention",
           "`jax.nn.dot_product_attention`'s XLA path, wrapped to keep the contract; a "
           "`mask_mod` as a dense mask; `return_max_scores`, when named, by a second pass "
           "through the blockwise kernel", _FORWARD_MODE, _dense(_fused(xla.xla_attention)),
           serves=_FLASH + ("max_scores",), named_only=("max_scores",), check=xla.check),
    Kernel("chunked", "chunked attention",
           "blockwise attention with an online softmax, a blockwise backward and a blockwise "
           "tangent (FlashAttention-style): no direction holds T x S, so memory is linear in the "
           "sequence length; key blocks that the causal mask, the window, the lengths, the "
           "segment ids or a block mask rule out are skipped; attention dropout with a "
           "counter-based mask regenerated per block (not flax's masks) "
           "({func}`attention_jax.chunked.chunked_attention` sets the block sizes)",
           _FORWARD_MODE + " (a custom JVP whose tangent, one more blockwise pass, transposes "
           "to the blockwise backward; through context parallelism too)", _chunked,
           serves=tuple(part for part in PARTS if part not in ("weights", "hooks"))),
    Kernel("cudnn", "cuDNN flash attention",
           "cuDNN's fused flash attention through `jax.nn.dot_product_attention("
           "implementation=\"cudnn\")`, float16 and bfloat16, head_dim a multiple of 8 up to "
           f"{cudnn.MAX_HEAD_DIM}; odd lengths are padded by one (cuDNN's backward refuses "
           "them); when named, a `mask_mod` as a dense mask and `return_max_scores` by a "
           "second pass through the blockwise kernel",
           _REVERSE_ONLY.format("jax's cuDNN custom VJP"),
           _dense(_fused(_checks.reverse_only(cudnn.cudnn_attention, "cudnn"))),
           serves=_FLASH + ("max_scores",), named_only=("mask_mod", "max_scores"),
           backend="gpu", measured_on=("9.0",),
           check=cudnn.check),  # Hopper: an H100 and an H200
    Kernel("pallas_tpu", "the Pallas TPU flash kernel",
           "the Pallas flash-attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`)"
           f"; lengths multiples of {pallas_tpu.LANES}; not on TPU v2/v3, where it fails (jax "
           "issue 18595); when named, a `mask_mod` as a dense mask and `return_max_scores` by "
           "a second pass through the blockwise kernel",
           _REVERSE_ONLY.format("the kernel's custom VJP"),
           _dense(_fused(_checks.reverse_only(pallas_tpu.pallas_tpu_attention, "pallas_tpu"))),
           serves=("mask_mod", "bias", "max_scores"), named_only=("mask_mod", "max_scores"),
           backend="tpu", check=pallas_tpu.check),
    Kernel("pallas_gpu", "the fused Pallas GPU kernel",
           "a fused kernel for score and mask functions written in Pallas on Triton "
           "({func}`attention_jax.pallas_gpu.flex_attention`): forward and backward skip the "
           "blocks that a block mask, the causal mask, the window, a `mask`, sequence lengths "
           "or segment ids leave empty (per example where they come as arrays), and evaluate no "
           "`mask_mod` on full ones; attention dropout with the blockwise kernel's "
           "counter-based masks; a bias only written as a `score_mod`",
           "jvp, jacfwd (a fused tangent kernel, which transposes to the backward kernels), "
           "vmap, shard_map; not hessian or the grad of a jvp (second order: "
           "implementation='chunked'); the floating arrays a score_mod closes over get "
           f"tangents and gradients (up to {pallas_gpu.MAX_TRAINED} entries, the gradients "
           "summed in a fixed order)",
           _pallas_gpu, serves=("dropout", "residual", "max_scores", "soft_cap", "score_mod",
                                "mask_mod"),
           backend="gpu", measured_on=("9.0",),
           chosen_for=("score_mod", "mask_mod", "soft_cap", "max_scores"),
           check=pallas_gpu.refusal),  # on an H200, 11 to 19 times the blockwise kernel's speed
)}

#: The names ``implementation=`` takes.
IMPLEMENTATIONS = tuple(KERNELS)
