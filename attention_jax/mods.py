"""Custom attention as functions, with PyTorch FlexAttention's conventions.

``score_mod(score, batch, head, q_idx, kv_idx) -> score`` changes one scaled logit;
``mask_mod(batch, head, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` attends to key
``kv_idx``. Both are written for scalars (int32 indices, as in torch) and applied to every entry
of a block at once (``jax.vmap``). Arrays a mod closes over are hoisted out of it (its jaxpr's
constants), so that they can enter a custom VJP as inputs and receive gradients: a learnable bias
table trains.

Masks combine as torch's do (``and_masks``, ``or_masks``, ``noop_mask``) and become dense
booleans with ``create_mask``; block masks (which blocks a kernel may skip) are in
``block_masks``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
# The jaxpr types from their public home, jax.extend.core (as pallas_gpu and tangent); jax.core
# only for what jax.extend.core does not offer (jax 0.10.2): eval_jaxpr, Tracer, ShapedArray.
from jax.extend import core as jex_core

from attention_jax import reference


@dataclasses.dataclass(frozen=True, eq=False)
class Mod:
  """A score_mod or mask_mod (``user``), and the same traced once at scalars: ``fn(consts,
  *scalars)`` with the arrays it closed over as explicit ``consts`` (for a custom VJP, which
  must see them as inputs to differentiate them), its scalar inputs varying over the shard_map
  axes of ``anchor`` (``vary_like``)."""
  user: Callable
  fn: Callable
  consts: tuple
  anchor: jax.Array | None = None
  jaxpr: jex_core.Jaxpr | None = None  # fn's, for kernels that evaluate it themselves

  def __call__(self, *arrays):
    """The mod on every entry of broadcast arrays (the score first, for a score_mod; then the
    batch, head, query and key indices), calling the user's function."""
    return pointwise(lambda consts, *scalars: self.user(*scalars), (), *arrays)


def pointwise(fn, consts, *arrays, anchor=None):
  """``fn(consts, *scalars)`` on every entry of the broadcast ``arrays``: one output per entry, in
  their broadcast shape (made to vary like ``anchor`` first, as ``fn`` was traced). One
  ``jax.vmap`` per axis of that shape, each mapping only the arrays that vary along it, so that
  whatever ``fn`` computes from some of its inputs is computed once per distinct value of
  those: a query index [T, 1] against key indices [S] reads ``documents[q_idx]`` T times, not
  T x S times, and a constant a block's head index selects (``slopes[h]``) is read, and its
  gradient added, once per call (an entry-wise gather's transpose is a scatter of every entry
  onto one address, which a GPU serialises)."""
  arrays = [vary_like(jnp.asarray(array), anchor) for array in arrays]
  shape = jnp.broadcast_shapes(*(array.shape for array in arrays))
  varies = [[len(shape) - array.ndim + axis for axis, size in enumerate(array.shape) if size > 1]
            for array in arrays]  # the axes of the broadcast shape along which each one varies
  arrays = [jnp.reshape(array, [shape[axis] for axis in axes])
            for array, axes in zip(arrays, varies)]
  mapped = fn
  for axis in reversed(range(len(shape))):
    in_axes = (None,) + tuple(0 if axis in axes else None for axes in varies)
    mapped = jax.vmap(mapped, in_axes=in_axes, axis_size=shape[axis])
  return mapped(tuple(consts), *arrays)


def vary_like(array, anchor):
  """``array``, varying over the shard_map axes that ``anchor`` (a scalar) varies over, at
  least: the identity outside shard_map, which XLA drops. A mod's jaxpr, traced on scalars
  that vary like the call's inputs, binds its primitives directly, so its operands must vary
  as they did then."""
  return array if anchor is None else jnp.where(anchor == 0, array, array)


def anchor_of(*arrays, shape=(), dtype=jnp.int32):
  """Zeros of ``shape`` and ``dtype`` (by default an int32 scalar) that vary over every shard_map
  axis any of ``arrays`` (None skipped) varies over."""
  leaves = jax.tree_util.tree_leaves(arrays)
  return sum((jnp.zeros_like(leaf, dtype, shape=()) for leaf in leaves), jnp.zeros(shape, dtype))


def is_trainable(const) -> bool:
  """Whether a constant a score_mod closed over gets a gradient (a floating array)."""
  return jnp.issubdtype(jnp.result_type(const), jnp.floating)


def _trace(mod, name, anchor, score_dtype=None):
  """The score_mod or mask_mod (``name``) ``mod`` as a Mod (None stays None), traced on scalars
  that vary like ``anchor``: for a score_mod a score of ``score_dtype``, then four int32 indices;
  its output checked to be one floating score, or one bool."""
  if mod is None:
    return None
  if not callable(mod):
    raise ValueError(f"{name} must be a function, got {mod!r}.")
  index = vary_like(jnp.zeros((), jnp.int32), anchor)
  is_score = name == "score_mod"
  score = (vary_like(jnp.zeros((), score_dtype), anchor),) if is_score else ()
  examples = score + (index,) * 4
  try:
    closed = jax.make_jaxpr(mod)(*examples)
  except jax.errors.JAXTypeError as error:  # a Python if, int() or numpy call on an index
    raise ValueError(f"{name} uses a traced index as a Python value "
                     f"({type(error).__name__}): a mod is traced once, on abstract indices; "
                     "write conditions with jnp.where(condition, a, b) or lax.cond, and index "
                     "arrays with jnp (not Python lists or numpy).") from None
  except TypeError as error:
    if "carry" in str(error):  # a loop whose carry starts invariant and comes out varying
      raise ValueError(f"{name}: a loop's carry must keep its type, and under shard_map the "
                       "indices vary over the mesh axes: start the carry from the score or an "
                       "index (e.g. jnp.zeros_like(score)), not from a constant.") from None
    raise ValueError(f"{name} must take {len(examples)} arguments ({_SIGNATURES[name]}): "
                     f"{error}") from None
  (out,) = closed.out_avals if len(closed.out_avals) == 1 else (None,)
  wanted = out is not None and out.shape == () and (
      jnp.issubdtype(out.dtype, jnp.floating) if is_score else out.dtype == jnp.bool_)
  if not wanted:
    got = "several outputs" if out is None else f"{out.dtype}{list(out.shape)}"
    raise ValueError(f"{name} must return {_RETURNS[name]} for scalar arguments "
                     f"({_SIGNATURES[name]}), got {got}.")
  jaxpr = closed.jaxpr

  def fn(consts, *scalars):
    return evaluate(jaxpr, consts, *scalars)[0]
  return Mod(mod, fn, tuple(closed.consts), anchor, jaxpr)


def evaluate(jaxpr, consts, *args) -> list:
  """``jaxpr`` on ``consts`` and ``args``, as jax.core.eval_jaxpr, except that a constant may
  come in varying over shard_map axes it was traced invariant over: the ``pvary`` that tracing
  put on it then adds only the axes it lacks, and calls (jit) are evaluated inline, so that their
  bodies do the same. A kernel's backward passes its trained constants so (``vary_over``): each
  block's gradient of a constant then stays on its device and is summed over the devices once,
  not by a collective inside the block loop, whose trip count may differ between devices."""
  env = {}
  read = lambda var: var.val if isinstance(var, jex_core.Literal) else env[var]
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    inputs = [read(var) for var in eqn.invars]
    body = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit", "closed_call") else None
    if eqn.primitive.name == "pvary":
      outputs = [_pvary_missing(eqn, x) for x in inputs]
    elif eqn.primitive.name in _CONTROL_FLOW:  # their bodies evaluated as this one is
      outputs = list(_CONTROL_FLOW[eqn.primitive.name](eqn.params, inputs))
    elif body is not None:
      outputs = evaluate(body.jaxpr, body.consts, *inputs)
    else:
      params = eqn.primitive.get_bind_params(eqn.params)
      # (subfunctions, params) in jax 0.8, the params alone in jax 0.10
      subfuns, params = params if isinstance(params, tuple) else ((), params)
      with eqn.ctx.manager:
        outputs = eqn.primitive.bind(*subfuns, *inputs, **params)
      outputs = outputs if eqn.primitive.multiple_results else [outputs]
    env.update(zip(eqn.outvars, outputs))
  return [read(var) for var in jaxpr.outvars]


def _closed(closed, anchor, *args) -> list:
  """A closed jaxpr (a branch or loop body) by ``evaluate``, its outputs varying like ``anchor``
  (the union of its caller's operands: a branch's or a carry's type then matches the others')."""
  return [vary_like(x, anchor) for x in evaluate(closed.jaxpr, closed.consts, *args)]


def _cond(params, inputs):
  """lax.cond and lax.switch as the vmap over a mod's entries makes them (its index varies from
  entry to entry): every branch evaluated, then each entry's own selected. No branch jaxpr is
  bound, whose pvary would be evaluated again on constants that vary already."""
  index, *operands = inputs
  anchor = anchor_of(*inputs)
  branches = [_closed(branch, anchor, *operands) for branch in params["branches"]]
  index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
  return [functools.reduce(lambda chosen, i: jnp.where(index == i, outs[i], chosen),
                           range(len(outs) - 2, -1, -1), outs[-1])
          for outs in zip(*branches)]


def _scan(params, inputs):
  body, (num_consts, num_carry) = params["jaxpr"], scan_layout(params)
  consts, carry = inputs[:num_consts], inputs[num_consts:num_consts + num_carry]
  xs = inputs[num_consts + num_carry:]
  anchor = anchor_of(*inputs)

  def step(carry, x):
    outs = _closed(body, anchor, *consts, *carry, *x)
    return outs[:num_carry], outs[num_carry:]
  carry, ys = jax.lax.scan(step, [vary_like(c, anchor) for c in carry], list(xs),
                           length=params["length"], reverse=params["reverse"],
                           unroll=params.get("unroll", 1))
  return list(carry) + list(ys)


def scan_layout(params) -> tuple[int, int]:
  """(constants, carries) among a scan's inputs: jax 0.10 names the counts, jax 0.12 gives the
  groups (constants, carries, xs) as flat trees of leaves."""
  if "num_consts" in params:
    return params["num_consts"], params["num_carry"]
  groups = params["ft_in"]
  consts, carry, _ = groups.unflatten() if hasattr(groups, "unflatten") else groups
  count = lambda group: len(jax.tree_util.tree_leaves(group, is_leaf=lambda x: x is None))
  return count(consts), count(carry)


def _while(params, inputs):
  num_cond, num_body = params["cond_nconsts"], params["body_nconsts"]
  cond_consts, body_consts = inputs[:num_cond], inputs[num_cond:num_cond + num_body]
  anchor = anchor_of(*inputs)
  carry = [vary_like(c, anchor) for c in inputs[num_cond + num_body:]]
  return jax.lax.while_loop(
      lambda carry: _closed(params["cond_jaxpr"], anchor, *cond_consts, *carry)[0],
      lambda carry: _closed(params["body_jaxpr"], anchor, *body_consts, *carry), carry)


#: Higher-order primitives whose bodies ``evaluate`` evaluates too (their constants may vary).
_CONTROL_FLOW = {"cond": _cond, "scan": _scan, "while": _while}


def _pvary_missing(eqn, x):
  """``x`` varying over the axes of the ``pvary`` equation ``eqn``: its primitive over those
  that ``x`` does not vary over yet."""
  missing = tuple(axis for axis in eqn.params["axes"] if axis not in varying_axes(x))
  if not missing:
    return x
  out = eqn.primitive.bind(x, **{**eqn.params, "axes": missing})
  return out[0] if eqn.primitive.multiple_results else out  # one list per call in jax 0.8


def varying_axes(array) -> frozenset:
  """The shard_map axes ``array`` varies over (empty outside shard_map): ``aval.vma`` in the
  jax versions that have it, ``aval.mat.varying`` in later ones."""
  aval = jax.typeof(array)
  vma = getattr(aval, "vma", None)
  return frozenset(getattr(getattr(aval, "mat", None), "varying", ()) if vma is None else vma)


def vary_over(consts: tuple, anchor) -> tuple:
  """The trainable ``consts`` varying like ``anchor`` (at least), the others as they are (see
  ``evaluate``)."""
  return tuple(vary_like(c, anchor) if is_trainable(c) else c for c in consts)


_SIGNATURES = {"score_mod": "score, batch, head, q_idx, kv_idx",
               "mask_mod": "batch, head, q_idx, kv_idx"}
_RETURNS = {"score_mod": "one floating score (a scalar like its score)",
            "mask_mod": "one bool (a scalar)"}


def trace_score_mod(score_mod, dtype=jnp.float32, anchor=None) -> Mod | None:
  """score_mod(score, batch, head, q_idx, kv_idx) -> score as a Mod (None stays None), traced
  on scalars that vary like ``anchor`` (``anchor_of`` the call's inputs)."""
  return _trace(score_mod, "score_mod", anchor, dtype)


def trace_mask_mod(mask_mod, anchor=None) -> Mod | None:
  """mask_mod(batch, head, q_idx, kv_idx) -> bool as a Mod (None stays None)."""
  return _trace(mask_mod, "mask_mod", anchor)


def dense_indices(batch_shape, num_heads, q_len, kv_len):
  """The batch, head, query and key indices, broadcastable to [..., N, T, S] (batch: the
  flattened index over ``batch_shape``)."""
  batch = jnp.reshape(jnp.arange(math.prod(batch_shape), dtype=jnp.int32),
                      tuple(batch_shape) + (1, 1, 1))
  head = jnp.arange(num_heads, dtype=jnp.int32)[:, None, None]  # [N, 1, 1]
  q_idx = jnp.arange(q_len, dtype=jnp.int32)[:, None]  # [T, 1]
  kv_idx = jnp.arange(kv_len, dtype=jnp.int32)  # [S]
  return batch, head, q_idx, kv_idx


def dense(score_mod, mask_mod, dtype, batch_shape, num_heads: int, q_len: int, kv_len: int):
  """The mods on every entry of [..., N, T, S] at once, as the dense implementations apply them:
  (the score_mod as a function of the logits, or None; the mask_mod's boolean mask, or None).
  ``dtype``: the query's (the score_mod is traced in its compute dtype)."""
  if score_mod is None and mask_mod is None:
    return None, None
  indices = dense_indices(batch_shape, num_heads, q_len, kv_len)
  score = trace_score_mod(score_mod, reference.compute_dtype(dtype))
  allow = trace_mask_mod(mask_mod)
  return (None if score is None else lambda logits: score(logits, *indices),
          None if allow is None else allow(*indices))


def noop_mask(batch, head, q_idx, kv_idx):
  """The mask_mod that allows every pair (torch's noop_mask).

  >>> bool(noop_mask(0, 0, 3, 7))
  True
  """
  del batch, head, q_idx, kv_idx
  return jnp.ones((), jnp.bool_)


def _combine(name: str, combine, empty: bool, mask_mods):
  """The mask_mod ``combine``-ing ``mask_mods``; with none, ``empty`` for every pair."""
  if not all(callable(mod) for mod in mask_mods):
    raise ValueError(f"{name} takes mask_mods (functions of batch, head, q_idx, kv_idx), got "
                     f"{[type(mod).__name__ for mod in mask_mods if not callable(mod)]}.")

  def mask_mod(batch, head, q_idx, kv_idx):
    return functools.reduce(combine, (mod(batch, head, q_idx, kv_idx) for mod in mask_mods),
                            jnp.full((), empty))
  return mask_mod


def and_masks(*mask_mods):
  """The mask_mod that allows a pair where every one of ``mask_mods`` does (torch's and_masks;
  with none, every pair).

  >>> causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  >>> window = lambda b, h, q_idx, kv_idx: q_idx - kv_idx < 4
  >>> bool(and_masks(causal, window)(0, 0, 9, 2)), bool(and_masks(causal, window)(0, 0, 9, 7))
  (False, True)
  """
  return _combine("and_masks", jnp.logical_and, True, mask_mods)


def or_masks(*mask_mods):
  """The mask_mod that allows a pair where any of ``mask_mods`` does (torch's or_masks; with
  none, no pair).

  >>> prefix = lambda b, h, q_idx, kv_idx: kv_idx < 4  # a bidirectional prefix
  >>> causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
  >>> bool(or_masks(prefix, causal)(0, 0, 1, 3)), bool(or_masks(prefix, causal)(0, 0, 5, 6))
  (True, False)
  """
  return _combine("or_masks", jnp.logical_or, False, mask_mods)


def create_mask(mod, batch: int | None, heads: int | None, q_len: int, kv_len: int) -> jax.Array:
  """The dense boolean mask [B or 1, N or 1, T, S] of a mask_mod, or of a score_mod (True where
  it leaves a score above -inf), as torch's create_mask: a function of 4 positional arguments
  is a mask_mod, of 5 a score_mod. For inspection and tests: O(T S) memory.

  >>> create_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 3, 3)[0, 0]
  Array([[ True, False, False],
         [ True,  True, False],
         [ True,  True,  True]], dtype=bool)
  """
  arity = _positional_arity(mod)
  if arity not in (4, 5):
    raise ValueError(f"create_mask takes a mask_mod ({_SIGNATURES['mask_mod']}) or a score_mod "
                     f"({_SIGNATURES['score_mod']}), got a function of {arity} positional "
                     "arguments.")
  score_mod, mask_mod = (None, mod) if arity == 4 else (mod, None)
  score, allow = dense(score_mod, mask_mod, jnp.float32, (batch or 1,), heads or 1, q_len, kv_len)
  return allow if score is None else score(jnp.zeros((), jnp.float32)) > -jnp.inf


def _positional_arity(fn) -> int | None:
  """How many positional arguments without a default ``fn`` takes (None: not inspectable)."""
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return None
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return sum(p.kind in positional and p.default is p.empty for p in parameters)


def sigmoid_bias(sigmoid_bias_value, kv_len: int) -> float:
  """The sigmoid attention bias b: as given, or -log(S) (Ramapuram et al. 2024)."""
  return -float(np.log(kv_len)) if sigmoid_bias_value is None else float(sigmoid_bias_value)
