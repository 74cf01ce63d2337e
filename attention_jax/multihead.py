"""Multi-head attention: per-head projections W_Q, W_K, W_V, attention per head, concat, W_O.

  head_n = Attention(X_q W_Q^n, X_kv W_K^n, X_kv W_V^n),   MultiHead = Concat(head_1..head_N) W_O

Shape letters: B batch dims, T query length, S key/value length, D_in input width, N heads,
H head dim d_k (qkv_features / N; the paper's d_model / h), D_out output width.

Parameters (the layout of ``flax.linen.MultiHeadDotProductAttention``, so weights transfer)::

  query/key/value: {"kernel": [D_in, N, H], "bias": [N, H]}  -- kernel[:, n, :] is W_Q^n
  out:             {"kernel": [N, H, D_out], "bias": [D_out]}
  qkv (fused):     {"kernel": [D_in, 3, N, H], "bias": [3, N, H]} replaces query/key/value
  temperature:     [N], only with scale="learned"
  query_ln/key_ln: {"scale": [H]}, only with normalize_qk (as flax's ``normalize_qk``)
  <variant name>:  a head variant's own (``attention_jax.variants``), e.g. "moh"; a variant may
                   change out's H (Variant.value_dim) and query_ln/key_ln's (query_key_dim)
  key/value with num_kv_heads = K: {"kernel": [D_in, K, H], "bias": [K, H]}
"""

from __future__ import annotations

import inspect
import math
import sys
from typing import Any, Callable, NamedTuple

from flax.core import meta
import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_jax import _checks
from attention_jax import attention as attention_lib
from attention_jax import hook_maps
from attention_jax import hooks as hooks_lib
from attention_jax import kv_cache
from attention_jax import masks as masks_lib
from attention_jax import variants
from attention_jax.products import dense_product

QK_NORM_EPSILON = 1e-6  # flax.linen.LayerNorm's default, so normalize_qk matches flax's

#: The named attention scales, as functions of the head dim d_k.
SCALES = {
    "inv_sqrt": lambda head_dim: 1.0 / math.sqrt(head_dim),  # the paper
    "none": lambda head_dim: 1.0,
    "inv": lambda head_dim: 1.0 / head_dim,
    "learned": lambda head_dim: 1.0 / math.sqrt(head_dim),  # initial value of the temperature
}


def resolve_scale(scale: float | str, head_dim: int) -> float:
  """The number a scale name stands for at ``head_dim`` ("learned": its initial value).

  >>> resolve_scale("inv_sqrt", 64), resolve_scale("inv", 64), resolve_scale(0.5, 64)
  (0.125, 0.015625, 0.5)
  """
  if isinstance(scale, str):
    if scale not in SCALES:
      raise ValueError(
          f"unknown attention scale {scale!r}; use a number or one of {sorted(SCALES)}.")
    return SCALES[scale](head_dim)
  if isinstance(scale, bool) or not isinstance(scale, (int, float)):
    raise ValueError(f"attention scale must be a number or a name in {sorted(SCALES)}, "
                     f"got {scale!r}.")
  return float(scale)


def variant_of(head_variant) -> variants.base.Variant:
  """The variant a layer runs: ``head_variant`` (a ``variants.Variant``, or a name that
  ``variants.get`` takes, with the variant's default options), or plain MHA for None."""
  if isinstance(head_variant, str):
    return variants.get(head_variant)
  if not isinstance(head_variant, (variants.Variant, type(None))):
    raise TypeError(f"head_variant must be a variants.Variant, its name or None, got "
                    f"{head_variant!r}; e.g. variants.get('gated').")
  return variants.Variant() if head_variant is None else head_variant


def head_dim_of(width: int, num_heads: int, *, name: str = "qkv_features",
                fix: str = "") -> int:
  """d_k = width / h (``width``: all heads together, d_model in the paper), with a one-line
  error naming ``name`` when h does not divide it."""
  if num_heads <= 0 or width % num_heads:
    raise ValueError(f"num_heads={num_heads} must divide {name}={width} (d_k = {name} / "
                     f"num_heads); choose a divisor of {width}{', ' + fix if fix else ''}.")
  return width // num_heads


def _project(x, params, *, dtype=None, precision=None):
  """x [..., L, D_in] with kernel [D_in, *F] -> [..., L, *F], computed in ``dtype`` (None: the
  promoted dtype of x and the parameters, as flax's DenseGeneral)."""
  dtype = dtype or jnp.result_type(x, *params.values())
  y = dense_product(x.astype(dtype), params["kernel"].astype(dtype), precision=precision)
  return y + params["bias"].astype(dtype) if "bias" in params else y


def project_qkv(params, inputs_q, inputs_k, inputs_v, *, dtype=None, precision=None):
  """Per-head projections: [..., T, D_in], [..., S, D_k], [..., S, D_v] -> query [..., T, N, H],
  key and value [..., S, K, H] (K = N unless the key/value kernels have fewer heads:
  grouped-query attention). The fused kernel needs self-attention (all three inputs the same)."""
  project = lambda x, name: _project(x, params[name], dtype=dtype, precision=precision)
  if "qkv" in params:
    if not inputs_q is inputs_k is inputs_v:
      raise ValueError("fused qkv projections need self-attention (inputs_k=inputs_v=None).")
    qkv = project(inputs_q, "qkv")  # [..., T, 3, N, H]
    return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
  return project(inputs_q, "query"), project(inputs_k, "key"), project(inputs_v, "value")


def key_value_inputs(inputs_q, inputs_k=None, inputs_v=None):
  """flax's defaults: inputs_k is inputs_q when None, inputs_v is inputs_k when None."""
  if inputs_k is None and inputs_v is not None:
    raise ValueError("inputs_v needs inputs_k: pass the same array as inputs_k and leave "
                     "inputs_v=None to use it for both.")
  inputs_k = inputs_q if inputs_k is None else inputs_k
  return inputs_k, inputs_k if inputs_v is None else inputs_v


def project_out(params, heads, *, dtype=None, precision=None):
  """Concat(head_1..head_N) W_O: [..., T, N, H] -> [..., T, D_out]."""
  out = params["out"]
  concat = jnp.reshape(heads, heads.shape[:-2] + (-1,))  # [..., T, N * H]
  kernel = jnp.reshape(out["kernel"], (-1, out["kernel"].shape[-1]))  # [N * H, D_out]
  return _project(concat, {**out, "kernel": kernel}, dtype=dtype, precision=precision)


def project_out_per_head(params, heads, *, dtype=None, precision=None):
  """``project_out`` as the sum of each head's contribution z_n W_O^n, which is the hook point
  ``attn.hook_result`` [..., T, N, D_out]: [..., T, N, H] -> [..., T, D_out].

  >>> params = {"out": {"kernel": jnp.ones((2, 3, 4)), "bias": jnp.zeros(4)}}  # [N, H, D_out]
  >>> project_out_per_head(params, jnp.ones((5, 2, 3)))[0]  # [T, N, H] -> [T, D_out]
  Array([6., 6., 6., 6.], dtype=float32)
  """
  out = params["out"]
  dtype = dtype or jnp.result_type(heads, *out.values())
  result = jnp.einsum("...nh,nhd->...nd", heads.astype(dtype), out["kernel"].astype(dtype),
                      precision=precision)  # [..., T, N, D_out]
  output = jnp.sum(hooks_lib.point("attn.hook_result", result), axis=-2)
  return output + out["bias"].astype(dtype) if "bias" in out else output


def qk_layer_norm(x, scale, epsilon: float = QK_NORM_EPSILON):
  """LayerNorm over the head dimension without bias (QK-norm, :ref:`Dehghani et al. 2023
  <ref-dehghani2023>`), times a learned ``scale`` [H], statistics in float32: [..., N, H] ->
  [..., N, H].

  >>> query = jnp.arange(12.0).reshape(1, 2, 3, 2)  # [B, T, N, H]
  >>> qk_layer_norm(query, jnp.ones(2))[0, 0]
  Array([[-1., 1.],
         [-1., 1.],
         [-1., 1.]], dtype=float32)
  """
  y = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  y = y - jnp.mean(y, axis=-1, keepdims=True)
  y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + epsilon)
  return (y * scale).astype(x.dtype)


def attention_inputs(params, inputs_q, inputs_k=None, inputs_v=None, *,
                     scale: float | str = "inv_sqrt", qk_transform: Callable | None = None,
                     dtype=None, precision=None, positions=None, head_variant=None):
  """Projected, QK-normed, transformed (``qk_transform``, with ``positions=`` [T] when given)
  query [..., T, N, H], key and value [..., S, K, H] in the variant's layout, and the scale left
  to apply to Q K^T (of the variant's ``scale_dim``)."""
  variant = variant_of(head_variant)
  inputs_k, inputs_v = key_value_inputs(inputs_q, inputs_k, inputs_v)
  query, key, value = project_qkv(params, inputs_q, inputs_k, inputs_v, dtype=dtype,
                                  precision=precision)  # [..., T|S, N|K, H]
  scale_dim = variant.scale_dim(query.shape[-1])
  query, key, value = variant.layout(query, key, value)
  if "query_ln" in params:
    query = qk_layer_norm(query, params["query_ln"]["scale"])
    key = qk_layer_norm(key, params["key_ln"]["scale"])
  if qk_transform is not None:
    query, key = (qk_transform(query, key) if positions is None else
                  qk_transform(query, key, positions=positions))
  if scale == "learned":  # a per-head temperature, folded into the query (and its sub-heads)
    temperature = params["temperature"]
    temperature = jnp.repeat(temperature, query.shape[-2] // temperature.shape[0])
    return query * temperature[:, None].astype(query.dtype), key, value, 1.0
  return query, key, value, resolve_scale(scale, scale_dim)


#: The arguments an ``attention_fn`` may be handed and the values that ask nothing of it: a
#: function that does not take one of them can serve a call only where it has this value.
NEUTRAL_ARGUMENTS = {
    "bias": None, "mask": None, "is_causal": False, "dropout_rate": 0.0, "dropout_rng": None,
    "broadcast_dropout": True, "deterministic": True, "dtype": None, "precision": None,
    "force_fp32_for_softmax": False, "return_weights": False, "implementation": None,
    "empty_rows": "mean", "module": None,
}


def _neutral(name, value, head_dim: int) -> bool:
  """Whether ``value`` of argument ``name`` asks nothing of an attention function."""
  if name == "scale":  # flax's functions scale by 1/sqrt(H) themselves
    return value is None or value == resolve_scale("inv_sqrt", head_dim)
  want = NEUTRAL_ARGUMENTS.get(name)  # None for the structure arguments (lengths, window, ...)
  return value is want or (isinstance(value, (bool, int, float, str)) and value == want)


def call_attention_fn(attention_fn, query, key, value, **arguments):
  """``attention_fn(query, key, value, **arguments)`` handing it only what it takes (all that
  asks something with ``**kwargs``); one it does not take that asks something raises ValueError."""
  parameters = inspect.signature(attention_fn).parameters
  takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
  head_dim = query.shape[-1]
  call = {}
  for name, argument in arguments.items():
    if name in parameters:
      call[name] = argument
    elif not _neutral(name, argument, head_dim):
      if not takes_any:
        raise ValueError(
            f"attention_fn {getattr(attention_fn, '__name__', attention_fn)!r} takes no "
            f"{name!r}, which this call sets to {argument!r}; use an attention_fn that takes it "
            "(attention_jax.dot_product_attention takes every argument) or leave it unset.")
      call[name] = argument
  return attention_fn(query, key, value, **call)


class Step(NamedTuple):
  """One multi-head attention call: its output (with the weights and residual when asked for),
  the updated cache (decoding), and {collection: {name: value}} to record: "intermediates" (the
  maps "attention_logits" and "attention_weights", the variant's records) and "losses"."""
  output: Any
  cache: kv_cache.KVCache | None = None
  records: dict[str, dict[str, jax.Array]] = {}


def multi_head_attention_step(params, inputs_q, inputs_k=None, inputs_v=None, *, mask=None,
                              bias=None, scale: float | str = "inv_sqrt", is_causal: bool = False,
                              qk_transform: Callable | None = None, dropout_rate: float = 0.0,
                              dropout_rng=None, broadcast_dropout: bool = True,
                              implementation: str | None = None, return_weights: bool = False,
                              attention_fn: Callable | None = None, dtype=None, precision=None,
                              cache: kv_cache.KVCache | None = None, return_maps: bool = False,
                              head_variant=None, **attention_args) -> Step:
  """``multi_head_attention`` with a key/value cache and what it records: what the modules
  run. With ``cache`` (decoding), inputs_q [..., T, D_in] are the next T tokens, appended to the
  cache, attending to every cached position up to their own (causal by construction).
  ``return_maps``: also record the logits and weights [..., N, T, S] (before dropout): those the
  call applies for a variant that forms its maps (``Variant.hooks``), else those the reference
  path forms from the same arguments, beside the kernel. A variant's hooks are called in the
  order ``variants.base`` lists.

  >>> x = jnp.ones((2, 5, 16))  # [B, T, D_in]
  >>> variables = MultiHeadAttention(num_heads=4).init(jax.random.key(0), x)
  >>> cache = kv_cache.init_kv_cache((2,), 8, 4, 4)  # 8 positions, 4 heads of 4
  >>> step = multi_head_attention_step(variables["params"], x[:, :1], cache=cache)
  >>> step.output.shape, int(step.cache.index)
  ((2, 1, 16), 1)
  """
  variant = variant_of(head_variant)
  if cache is not None and variant.decoding:
    raise ValueError(f"head variant {variant.name!r} {variant.decoding}")
  positions = None if cache is None else kv_cache.positions(cache, inputs_q.shape[-2])
  inputs_k, inputs_v = key_value_inputs(inputs_q, inputs_k, inputs_v)
  num_heads = params["out"]["kernel"].shape[0]
  state = variant.prepare(params.get(variant.name, {}), inputs_q, inputs_k, num_heads=num_heads)
  attention_args = with_variant_arguments(attention_args, variant, state)
  # The named scopes label the three parts in profiles (scripts/profile_train.py).
  with jax.named_scope("qkv_projection"):
    query, key, value, scale = attention_inputs(
        params, inputs_q, inputs_k, inputs_v, scale=scale, qk_transform=qk_transform,
        dtype=dtype, precision=precision, positions=positions, head_variant=variant)
  query, key, value = (hooks_lib.point(f"attn.hook_{name}", x)  # the hook points, identities
                       for name, x in zip("qkv", (query, key, value)))  # unless asked for
  if cache is not None:
    cache, visible = kv_cache.append(cache, key, value)  # visible [T, L]
    key, value = cache.key.astype(query.dtype), cache.value.astype(query.dtype)
    mask, is_causal = masks_lib.combine_masks(mask, visible), False
  dropout = {"dropout_rate": dropout_rate, "dropout_rng": dropout_rng,
             "broadcast_dropout": broadcast_dropout, "deterministic": False} if (
                 dropout_rate > 0.0) else {}
  hooks = variant.hooks(state)  # None unless the variant forms its own maps
  mask, bias = (_per_head(x, query.shape[-2], num_heads) for x in (mask, bias))
  # the hooked maps: patched on the path that forms them, or captured (every row: beside the
  # kernel; query_rows: from the kernel's log-sum-exp)
  patch_maps, hook_rows = hook_maps.maps_patched(), None
  capture_maps = hook_maps.maps_asked() and not patch_maps
  if capture_maps:
    hook_rows = hooks_lib.query_rows()
    return_maps = return_maps or hook_rows is None
  maps_too = return_maps and hooks is not None  # the maps from the call that applies them
  lse_asked = hook_rows is not None and not attention_args.get("return_residual")
  with jax.named_scope("dot_product_attention"), attention_lib.default_precision(precision):
    call = dict(bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                return_weights=return_weights or maps_too, implementation=implementation,
                dtype=dtype, precision=precision, **dropout, **attention_args)
    if patch_maps:
      result = hook_maps.patched_attention(query, key, value, variant_hooks=hooks, **call)
    else:
      result = call_attention_fn(
          attention_fn or attention_lib.dot_product_attention, query, key, value, **call,
          **({"hooks": hooks, "return_logits": maps_too} if hooks is not None else {}),
          **({"return_residual": True} if lse_asked else {}))
    heads, *extras = result if isinstance(result, tuple) else (result,)  # [..., T, N, H]
    if maps_too:
      weights, logits, *extras = extras
      maps, extras = (logits, weights), [weights] * return_weights + extras
    elif return_maps:  # the same dense path on the same arguments, beside a fused kernel
      options = {k: v for k, v in attention_args.items()  # the maps only: no row statistics
                 if k not in ("return_residual", "return_max_scores")}
      _, weights, logits = attention_lib.dot_product_attention(
          query, key, value, bias, mask, scale=scale, is_causal=is_causal,
          implementation="reference", return_weights=True, return_logits=True, **options)
      maps = (logits, weights)
    if hook_rows is not None:
      if hooks is not None:
        raise ValueError(f"head variant {variant.name!r} forms its own maps: capture them "
                         "without query_rows (every row).")
      residual = extras[int(return_weights)]
      if lse_asked:
        del extras[int(return_weights)]
      hooked = hook_maps.rows_from_residual(query, key, residual, hook_rows, scale=scale,
                                            bias=bias, mask=mask, is_causal=is_causal,
                                            **attention_args)
    elif capture_maps:
      hooked = maps
    if capture_maps:
      for name, value_map in zip(hooks_lib.MAPS, hooked):
        hooks_lib.point(name, value_map)
  heads = hooks_lib.point("attn.hook_z", variant.heads(state, heads))  # [..., T, N, H]
  with jax.named_scope("out_projection"):
    project = project_out_per_head if hooks_lib.asks("attn.hook_result") else project_out
    output = project(params, heads, dtype=dtype, precision=precision)  # [..., T, D_out]
  intermediates = dict(zip(("attention_logits", "attention_weights"), maps)) if (
      return_maps) else {}
  records = {"intermediates": intermediates, variants.LOSSES: {}}
  for collection, values in variant.records(state).items():  # "intermediates" and LOSSES
    records[collection] = {**records[collection], **values}
  return Step((output, *extras) if extras else output, cache, records)


def multi_head_attention(params, inputs_q, inputs_k=None, inputs_v=None, *, mask=None,
                         bias=None, scale: float | str = "inv_sqrt", is_causal: bool = False,
                         qk_transform: Callable | None = None, dropout_rate: float = 0.0,
                         dropout_rng=None, broadcast_dropout: bool = True,
                         implementation: str | None = None, return_weights: bool = False,
                         attention_fn: Callable | None = None, dtype=None, precision=None,
                         head_variant=None, **attention_args):
  """Multi-head attention as a pure function of its parameters (layout in the module docstring).

  Args:
    params: the parameter dict of ``MultiHeadAttention`` (``variables["params"]``).
    inputs_q: [..., T, D_in].
    inputs_k: [..., S, D_k]; None for self-attention (inputs_q).
    inputs_v: [..., S, D_v]; None: inputs_k.
    mask, bias, is_causal: as in ``dot_product_attention``, broadcastable to [..., N, T, S].
    scale: a number or "inv_sqrt" (1/sqrt(H)), "none" (1), "inv" (1/H), "learned" (a per-head
      temperature params["temperature"] [N], starting at 1/sqrt(H)).
    qk_transform: optional (query, key) -> (query, key) on [..., T|S, N, H], e.g. RoPE.
    dropout_rate, dropout_rng, broadcast_dropout, implementation, return_weights: as in
      ``dot_product_attention``.
    attention_fn: what computes attention from the projected heads: ``dot_product_attention``
      (None, the default), flax's functions, ``ContextParallel(mesh, axis_name)`` or yours; it
      is handed the arguments it takes (``call_attention_fn``).
    dtype: the dtype of the computation (None: the promoted dtype of the inputs and the
      parameters), e.g. bfloat16 over float32 parameters, as flax's ``dtype``.
    precision: of the matrix products (a ``jax.lax.Precision`` or its name), as flax's.
    head_variant: a ``variants.Variant`` (``variants.get(name)``: talking heads, DCMHA, MoH,
      overlapping heads, gated, differential, yours), its name (default options) or None (plain
      multi-head attention); its parameters are in ``params[variant.name]``.
    **attention_args: the other keyword arguments of ``dot_product_attention``
      (query_seq_lengths, key_value_seq_lengths, local_window_size, logits_soft_cap,
      query_segment_ids, key_segment_ids, return_residual, empty_rows).

  Returns:
    [..., T, D_out]; followed by the weights [..., N, T, S] with ``return_weights`` and the
    log-sum-exp [..., T, N] with ``return_residual`` (a tuple then).

  >>> x = jnp.ones((2, 10, 128))  # [B, T, D_in]
  >>> variables = MultiHeadAttention(num_heads=8, qkv_features=256).init(jax.random.key(0), x)
  >>> multi_head_attention(variables["params"], x).shape  # 8 heads of d_k = 32
  (2, 10, 128)
  """
  return multi_head_attention_step(
      params, inputs_q, inputs_k, inputs_v, mask=mask, bias=bias, scale=scale,
      is_causal=is_causal, qk_transform=qk_transform, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng, broadcast_dropout=broadcast_dropout, implementation=implementation,
      return_weights=return_weights, attention_fn=attention_fn, dtype=dtype, precision=precision,
      head_variant=head_variant, **attention_args).output


def _per_head(x, heads: int, num_heads: int):
  """A mask or bias [..., N, T, S] repeated for a variant's N' = ``heads`` sub-heads
  (differential's 2N); any other stays as it is."""
  if x is None or heads == num_heads or jnp.ndim(x) < 3 or x.shape[-3] != num_heads:
    return x
  return jnp.repeat(jnp.asarray(x), heads // num_heads, axis=-3)


def with_variant_arguments(attention_args: dict, variant, state) -> dict:
  """The call's attention arguments with those the variant sets; one set by both is refused."""
  added = variant.attention_arguments(state)
  both = sorted(set(added) & {name for name, value in attention_args.items()
                              if value is not None})
  if both:
    raise ValueError(f"head variant {variant.name!r} sets {', '.join(both)} itself; do not pass "
                     "it to the layer too.")
  return {**attention_args, **added}


def attention_maps(params, inputs_q, inputs_k=None, **options):
  """(logits, weights), each [..., N, T, S]: what ``multi_head_attention`` with the same
  arguments forms and applies (the weights before dropout; a variant's after its hooks, possibly
  negative; the logits after the bias and score_mod, before the mask). ``options``: those of
  ``multi_head_attention_step``.

  >>> x = jnp.ones((2, 6, 32))  # [B, T, D_in]
  >>> params = MultiHeadAttention(num_heads=4).init(jax.random.key(0), x)["params"]
  >>> logits, weights = attention_maps(params, x, local_window_size=2)
  >>> weights.shape
  (2, 4, 6, 6)
  """
  maps = multi_head_attention_step(params, inputs_q, inputs_k, return_maps=True,
                                   **options).records["intermediates"]
  return maps["attention_logits"], maps["attention_weights"]


def multi_head_attention_logits(params, inputs_q, inputs_k=None, *, bias=None,
                                scale: float | str = "inv_sqrt",
                                qk_transform: Callable | None = None,
                                logits_soft_cap: float | None = None, head_variant=None):
  """The logits Q K^T * scale + bias [..., N, T, S] that the softmax of each head sees (mixed,
  with talking heads or DCMHA).

  >>> x = jnp.ones((2, 6, 32))  # [B, T, D_in]
  >>> params = MultiHeadAttention(num_heads=8).init(jax.random.key(0), x)["params"]
  >>> multi_head_attention_logits(params, x).shape
  (2, 8, 6, 6)
  """
  return attention_maps(params, inputs_q, inputs_k, bias=bias, scale=scale,
                        qk_transform=qk_transform, logits_soft_cap=logits_soft_cap,
                        head_variant=head_variant)[0]


def multi_head_attention_weights(params, inputs_q, inputs_k=None, **options):
  """The softmax weights [..., N, T, S] that ``multi_head_attention`` applies (before dropout);
  ``options`` as ``attention_maps``.

  >>> x = jnp.ones((2, 6, 32))  # [B, T, D_in]
  >>> params = MultiHeadAttention(num_heads=8).init(jax.random.key(0), x)["params"]
  >>> multi_head_attention_weights(params, x, is_causal=True).shape
  (2, 8, 6, 6)
  """
  return attention_maps(params, inputs_q, inputs_k, **options)[1]


def flat_init(init: Callable, shape, input_dims: int) -> Callable:
  """``init`` drawn as the matrix [prod(shape[:input_dims]), prod(shape[input_dims:])] and
  reshaped to ``shape``, as flax's DenseGeneral and LinearGeneral draw theirs (the same key gives
  flax's numbers); Linen's and NNX's sharding metadata stays on the result."""
  flat = ((math.prod(shape[:input_dims]),) if input_dims else ()) + (
      math.prod(shape[input_dims:]),)

  def initialize(rng, _shape=None, dtype=jnp.float32):
    value = init(rng, flat, dtype)
    if isinstance(value, meta.AxisMetadata):
      return meta.replace_boxed(value, jnp.reshape(value.unbox(), shape))
    nnx = sys.modules.get("flax.nnx")  # NNX's metadata exists only once NNX is imported
    if nnx is not None and isinstance(value, nnx.VariableMetadata):
      value.raw_value = jnp.reshape(value.raw_value, shape)
      return value
    return jnp.reshape(value, shape)
  return initialize


def projection_specs(kernel_shape, input_dims: int, *, use_bias: bool, kernel_init,
                     bias_init) -> dict[str, tuple[tuple[int, ...], Callable]]:
  """{"kernel": (shape, initializer), "bias": ...}: one projection's parameters, as the Linen and
  NNX holders declare them (``flat_init``)."""
  specs = {"kernel": (kernel_shape, flat_init(kernel_init, kernel_shape, input_dims))}
  if use_bias:
    bias_shape = kernel_shape[input_dims:]
    specs["bias"] = (bias_shape, flat_init(bias_init, bias_shape, 0))
  return specs


#: The settings a layer is built and run with (the Linen module's attributes, which the NNX
#: module keeps from its arguments of the same names); ``parameter_specs`` and ``shell_step``
#: read them.
SETTINGS = ("num_heads", "qkv_features", "out_features", "num_kv_heads", "fused_qkv",
            "normalize_qk", "use_bias", "kernel_init", "bias_init", "out_kernel_init",
            "out_bias_init", "query_kernel_init", "head_variant", "scale", "qk_transform",
            "broadcast_dropout", "implementation", "attention_fn", "dtype", "precision",
            "empty_rows", "dropout_rate")


def parameter_specs(layer, d_in: int, d_in_k: int, d_in_v: int) -> dict:
  """{group: {name: (shape, initializer)}}, and "temperature": (shape, initializer) with
  scale="learned": the parameters of ``layer`` (its ``SETTINGS``) for query, key and value
  inputs of widths ``d_in``, ``d_in_k``, ``d_in_v``, as the module docstring lays them out, in
  flax's order (the order NNX draws them in). Unknown scales and head counts fail here, before
  any parameter is made.

  >>> parameter_specs(MultiHeadAttention(num_heads=4, num_kv_heads=2), 16, 16, 16)["key"]
  {'kernel': ((16, 2, 4), <function ...>), 'bias': ((2, 4), <function ...>)}
  """
  num_heads, variant = layer.num_heads, variant_of(layer.head_variant)
  head_dim = head_dim_of(layer.qkv_features or d_in, num_heads)
  resolve_scale(layer.scale, head_dim)
  num_kv_heads = check_heads(num_heads, layer.num_kv_heads, layer.fused_qkv)
  variant.check(num_heads=num_heads, head_dim=head_dim)
  projection = lambda shape, input_dims=1, out=False, init=None: projection_specs(
      shape, input_dims, use_bias=layer.use_bias,
      kernel_init=init or (out and layer.out_kernel_init) or layer.kernel_init,
      bias_init=(out and layer.out_bias_init) or layer.bias_init)
  heads, kv_heads = (num_heads, head_dim), (num_kv_heads, head_dim)
  if layer.fused_qkv:
    if layer.query_kernel_init is not None:
      raise ValueError("query_kernel_init needs separate projections: W_Q is one slice of the "
                       "fused qkv kernel; use fused_qkv=False.")
    specs = {"qkv": projection((d_in, 3) + heads)}  # [D_in, 3, N, H]
  else:
    specs = {"query": projection((d_in,) + heads, init=layer.query_kernel_init),
             "key": projection((d_in_k,) + kv_heads),
             "value": projection((d_in_v,) + kv_heads)}  # [D, N or K, H]
  if layer.normalize_qk:
    specs["query_ln"] = specs["key_ln"] = {
        "scale": ((variant.query_key_dim(head_dim),), jax.nn.initializers.ones)}
  d_out = layer.out_features or d_in
  specs["out"] = projection((num_heads, variant.value_dim(head_dim), d_out), 2, out=True)
  own = variant.params(in_features=d_in, num_heads=num_heads, head_dim=head_dim)
  if own:
    specs[variant.name] = own
  if layer.scale == "learned":  # a constant, drawn from no key
    initial = resolve_scale("learned", head_dim)
    specs["temperature"] = ((num_heads,), nn.initializers.constant(initial))
  return specs


def empty_cache(params, inputs, *, dtype=None, head_variant=None) -> kv_cache.KVCache:
  """An empty key/value cache for key inputs like ``inputs`` [..., L, D] (an array or its
  shape; L the longest sequence): zeros shaped as the keys and values [..., L, K, H] the layer
  projects, in ``dtype`` (None: theirs)."""
  width = lambda name: params["qkv" if "qkv" in params else name]["kernel"].shape[0]
  like = lambda name: jax.ShapeDtypeStruct(tuple(inputs.shape[:-1]) + (width(name),),
                                           inputs.dtype)
  _, key, value, _ = jax.eval_shape(
      lambda p, xq, xk: attention_inputs(p, xq, xq if "qkv" in p else xk, dtype=dtype,
                                         head_variant=head_variant),
      params, like("query"), like("key"))
  zeros = lambda x: jnp.zeros(x.shape, dtype or x.dtype)
  return kv_cache.KVCache(zeros(key), zeros(value), jnp.array(0, jnp.int32))


def shell_step(layer, params, inputs_q, inputs_k, inputs_v, *, dropout_rng, **call) -> Step:
  """The step that a Linen or NNX shell runs: its ``SETTINGS``, its dropout_rate where the call
  has a ``dropout_rng`` (None: no dropout), and the call's other arguments."""
  settings = {name: getattr(layer, name) for name in (
      "scale", "qk_transform", "broadcast_dropout", "implementation", "attention_fn", "dtype",
      "precision", "head_variant")}
  if layer.empty_rows != "mean":  # the default, which an attention_fn need not take
    settings["empty_rows"] = layer.empty_rows
  dropout_rate = layer.dropout_rate if dropout_rng is not None else 0.0
  return multi_head_attention_step(params, inputs_q, inputs_k, inputs_v, dropout_rate=dropout_rate,
                                   dropout_rng=dropout_rng, **settings, **call)


class _Params(nn.Module):
  """Holds the parameters of one group of ``parameter_specs``, given as ((name, shape,
  initializer), ...), and hands them back as {name: array}."""
  specs: Any
  param_dtype: Any

  @nn.compact
  def __call__(self):
    return {name: self.param(name, init, shape, self.param_dtype)
            for name, shape, init in self.specs}


def check_heads(num_heads: int, num_kv_heads: int | None, fused_qkv: bool = False) -> int:
  """K, the number of key/value heads (N unless given), checked against N."""
  num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
  if num_kv_heads <= 0 or num_heads % num_kv_heads:
    raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} "
                     f"(grouped-query attention); choose num_kv_heads among its divisors.")
  if fused_qkv and num_kv_heads != num_heads:
    raise ValueError("fused_qkv=True needs as many key/value heads as query heads; leave "
                     "num_kv_heads=None or set fused_qkv=False.")
  return num_kv_heads


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention (:ref:`Vaswani et al. 2017 <ref-vaswani2017>`, section 3.2.2) as a Flax
  Linen module: a drop-in for ``flax.linen.MultiHeadDotProductAttention`` (also under flax's
  other names, ``MultiHeadAttention`` and ``SelfAttention``).

  flax's attributes come first, with flax's names, order, defaults and meaning, so the same
  arguments give the same parameter tree, auto-name, initial parameters, outputs, dropout masks,
  decode cache, sown weights and partitioning metadata; ``force_fp32_for_softmax`` is accepted
  (the softmax is float32 or wider anyway) and of the ``*_dot_general*`` and ``*_einsum_cls``
  attributes only None is served. Ours follow:

  Attributes:
    num_kv_heads: K key/value heads (grouped-query attention; N a multiple of K); default N.
    scale: as in ``multi_head_attention``.
    implementation: passed to ``dot_product_attention``.
    fused_qkv: one [D_in, 3, N, H] kernel for W_Q, W_K, W_V (self-attention only).
    qk_transform: as in ``multi_head_attention``; while decoding it is called with
      ``positions=`` [T], the new tokens' positions.
    head_variant: as in ``multi_head_attention``.
    empty_rows: what a query row with no key gives, "mean" (flax's) or "zero".

  ``attention_fn`` may be flax's functions, ``ContextParallel(mesh, axis_name)`` or yours
  (handed the arguments it takes). The call is flax's plus ``bias``, ``is_causal`` and the
  keyword arguments of ``multi_head_attention``. ``sow_weights`` sows the weights and logits
  [..., N, T, S] in "intermediates" (None: whenever it is mutable); a head variant's records
  (MoH's "head_gates") and losses are sown in "intermediates" and "losses" when mutable.

  >>> x = jnp.ones((2, 10, 128))  # [B, T, D_in]
  >>> layer = MultiHeadDotProductAttention(num_heads=8, qkv_features=256)  # 8 heads of d_k = 32
  >>> variables = layer.init(jax.random.key(0), x)
  >>> y, state = layer.apply(variables, x, sow_weights=True, mutable="intermediates")
  >>> y.shape, state["intermediates"]["attention_weights"][0].shape
  ((2, 10, 128), (2, 8, 10, 10))
  """
  num_heads: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: int | None = None
  out_features: int | None = None
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Callable = nn.initializers.lecun_normal()
  out_kernel_init: Callable | None = None
  bias_init: Callable = nn.initializers.zeros_init()
  out_bias_init: Callable | None = None
  use_bias: bool = True
  attention_fn: Callable | None = None
  decode: bool = False
  normalize_qk: bool = False
  force_fp32_for_softmax: bool = False
  qkv_dot_general: Any = None
  out_dot_general: Any = None
  qkv_dot_general_cls: Any = None
  out_dot_general_cls: Any = None
  qk_attn_weights_einsum_cls: Any = None
  attn_weights_value_einsum_cls: Any = None
  # ours
  num_kv_heads: int | None = None
  scale: float | str = "inv_sqrt"
  implementation: str | None = None
  fused_qkv: bool = False
  qk_transform: Callable | None = None
  head_variant: Any = None
  empty_rows: str = "mean"
  query_kernel_init: Callable | None = None  # W_Q's own initializer (None: kernel_init)

  def _parameters(self, d_in: int, d_in_k: int, d_in_v: int):
    specs = parameter_specs(self, d_in, d_in_k, d_in_v)
    return {name: _Params(tuple((key, *spec) for key, spec in group.items()), self.param_dtype,
                          name=name)() if isinstance(group, dict) else
            self.param(name, group[1], group[0], self.param_dtype)
            for name, group in specs.items()}

  def _cache(self, params, inputs_k):
    """The cache while decoding (None at init, which makes it), and a function that stores one."""
    if not self.decode:
      return None, None
    initialized = self.has_variable("cache", "cached_key")
    empty = empty_cache(params, inputs_k, dtype=self.dtype, head_variant=self.head_variant)
    variables = [self.variable("cache", name, lambda array=array: array)  # at init: inputs_k's L
                 for name, array in zip(("cached_key", "cached_value", "cache_index"), empty)]

    def store(cache):
      for variable, array in zip(variables, cache):
        variable.value = array
    return (kv_cache.KVCache(*(v.value for v in variables)) if initialized else None), store

  @nn.compact
  def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None,
               deterministic: bool | None = None, dropout_rng=None,
               sow_weights: bool | None = False, bias=None, is_causal: bool = False,
               **attention_args):
    """inputs_q [..., T, D_in], inputs_k [..., S, D_k] (None: inputs_q), inputs_v [..., S, D_v]
    (None: inputs_k) -> [..., T, D_out]; ``attention_args``: ``multi_head_attention``'s."""
    _checks.refuse_unserved(**{name: getattr(self, name) for name in (
        "qkv_dot_general", "out_dot_general", "qkv_dot_general_cls", "out_dot_general_cls",
        "qk_attn_weights_einsum_cls", "attn_weights_value_einsum_cls")})
    if inputs_kv is not None:
      if inputs_k is not None or inputs_v is not None:
        raise ValueError("pass either inputs_kv or inputs_k/inputs_v, not both (inputs_kv is "
                         "flax's older name for the two together).")
      inputs_k = inputs_kv
    inputs_k, inputs_v = key_value_inputs(inputs_q, inputs_k, inputs_v)
    params = self._parameters(inputs_q.shape[-1], inputs_k.shape[-1], inputs_v.shape[-1])
    # deterministic is asked for only with dropout, as flax
    if self.dropout_rate <= 0.0 or nn.merge_param("deterministic", self.deterministic,
                                                  deterministic):
      dropout_rng = None
    elif dropout_rng is None:
      dropout_rng = self.make_rng("dropout")
    cache, store = self._cache(params, inputs_k)
    sow = self.is_mutable_collection("intermediates") if sow_weights is None else sow_weights
    step = shell_step(self, params, inputs_q, inputs_k, inputs_v, mask=mask, bias=bias,
                      is_causal=is_causal, dropout_rng=dropout_rng, cache=cache, return_maps=sow,
                      **attention_args)
    if step.cache is not None:
      store(step.cache)
    for collection, records in step.records.items():  # sown where the collection is mutable
      for name, value in records.items():
        self.sow(collection, name, value)
    return step.output


class MultiHeadAttention(MultiHeadDotProductAttention):
  """``MultiHeadDotProductAttention`` under flax's other name (auto-named
  ``MultiHeadAttention_{i}``, as flax's ``nn.MultiHeadAttention``).

  >>> x = jnp.ones((2, 10, 128))  # [B, T, D_in]
  >>> layer = MultiHeadAttention(num_heads=8, qkv_features=256)  # 8 heads of d_k = 32
  >>> layer.apply(layer.init(jax.random.key(0), x), x).shape
  (2, 10, 128)
  """


class SelfAttention(MultiHeadDotProductAttention):
  """Self-attention, flax's ``nn.SelfAttention``: ``(inputs_q, mask=None, deterministic=None,
  dropout_rng=None, sow_weights=False)`` (plus ``MultiHeadDotProductAttention``'s keyword
  arguments).

  >>> x = jnp.ones((2, 10, 16))  # [B, T, D]
  >>> layer = SelfAttention(num_heads=4)
  >>> layer.apply(layer.init(jax.random.key(0), x), x).shape
  (2, 10, 16)
  """

  @nn.compact
  def __call__(self, inputs_q, mask=None, deterministic: bool | None = None, dropout_rng=None,
               sow_weights: bool | None = False, **options):
    return super().__call__(inputs_q, mask=mask, deterministic=deterministic,
                            dropout_rng=dropout_rng, sow_weights=sow_weights, **options)
