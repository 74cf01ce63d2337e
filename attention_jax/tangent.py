"""A kernel's tangent as a primitive that is linear in its tangents and transposes to the
kernel's own backward pass: forward mode (jvp, jacfwd) through a memory-efficient kernel
without giving up the hand-written reverse mode.

A ``jax.custom_vjp`` kernel refuses forward mode; a ``jax.custom_jvp`` one gets reverse mode
by transposing its tangent, which JAX would do through the tangent's blockwise loops (slower and
holding more than the backward pass). ``linear`` binds one primitive instead:

  outputs = fn(residuals, tangents)           linear in ``tangents``
  transpose(residuals, cotangents) -> cotangents of ``tangents``   the kernel's backward

so ``grad`` (linearize, then transpose) runs ``transpose``, and ``jvp`` runs ``fn``. Forward
over reverse differentiates ``transpose``. Second order through the residuals (reverse over
forward: hessian-vector products as grad of a jvp) needs the residuals split as
``(point, other)``, ``point`` the inputs whose tangents ``tangents`` are and ``other`` what
``derive(point, other)`` recomputes from them (the kernel's output and log-sum-exp). Then
fn(residuals, t) = D f(point) t for the kernel f, and its derivative in the point,

  D^2 f(point)[t, dp] = jvp of p -> fn((p, derive(p, other)), t) in direction dp,

is one more primitive linear in dp whose transpose is, by the symmetry of second derivatives,

  c -> D(D f^T c)(point)[t] = jvp of p -> transpose((p, derive(p, other)), c) in direction t,

forward mode through the kernel's backward pass: both stay blockwise, and nothing transposes
``fn``'s loops (JAX cannot transpose loops with dynamic bounds).

>>> w = jnp.array([[1.0, 2.0], [3.0, 4.0]])
>>> apply = lambda res, t: (res[0] @ t[0],)
>>> back = lambda res, ct: (res[0].T @ ct[0],)
>>> f = lambda x: linear(apply, back, (w,), (x,))[0]
>>> jax.grad(lambda x: f(x).sum())(jnp.ones(2))
Array([4., 6.], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

linear_p = core.Primitive("linear_tangent")
linear_p.multiple_results = True


def linear(fn, transpose, residuals, tangents, like=None, derive=None, second_order=None):
  """``fn(residuals, tangents)`` (a tuple of arrays, linear in the pytree ``tangents``), whose
  transpose is ``transpose(residuals, cotangents)`` (a pytree like ``tangents``). ``fn`` and
  ``transpose`` must be hashable (module functions, or functools.partial of hashable values).
  ``like``: residuals whose types (shape, dtype and, under shard_map, the axes they vary over)
  the outputs have; without it ``fn`` is traced for its output shapes, which serves only
  outside shard_map. ``derive``: residuals are ``(point, other)``, ``point`` of ``tangents``'
  structure, and ``derive(point, other)`` recomputes ``other`` at ``point``; second order then
  reads the point's tangents only (the module's docstring), else it differentiates ``fn``.
  ``second_order``: for a kernel without either, the one-line error that second order raises
  (under a tangent of the residuals) instead."""
  res_leaves, res_tree = jax.tree.flatten(residuals)
  tan_leaves, tan_tree = jax.tree.flatten(tangents)
  if derive is not None and jax.tree.structure(residuals[0]) != tan_tree:
    raise ValueError(f"linear: the point {jax.tree.structure(residuals[0])} must have the "
                     f"tangents' structure {tan_tree}.")
  like = None if like is None else tuple(
      next(i for i, leaf in enumerate(res_leaves) if leaf is x) for x in like)
  return linear_p.bind(*res_leaves, *tan_leaves, fn=fn, transpose=transpose, res_tree=res_tree,
                       tan_tree=tan_tree, batch=(), like=like, derive=derive,
                       second_order=second_order)


@dataclasses.dataclass(frozen=True)
class _Second:
  """The second derivative in the point, D^2 f(point)[t, dp], linear in dp (the module's
  docstring): residuals ((point, other), t), tangents dp of the point's structure."""
  fn: Callable
  transpose: Callable
  derive: Callable

  def apply(self, residuals, d_point):
    (point, other), t = residuals
    at = lambda p: self.fn((p, self.derive(p, other)), t)
    return jax.jvp(at, (point,), (d_point,))[1]

  def cotangent(self, residuals, cotangents):
    (point, other), t = residuals
    at = lambda p: self.transpose((p, self.derive(p, other)), cotangents)
    return jax.jvp(at, (point,), (t,))[1]


#: The one line with which reverse mode over a kernel's gradient or second derivative is refused.
REVERSE_TWICE = (
    "The blockwise kernel serves first order (grad, jvp, jacfwd, linearize), second order as "
    "forward over reverse (jax.hessian, a jvp of a grad) or reverse over forward (a grad of a "
    "jvp), and forward mode over any of those; reverse mode over a gradient or a second "
    "derivative (a grad of a grad, a grad of a hessian) is refused, as its loops have dynamic "
    "bounds, which JAX cannot transpose: take the outer derivative with jax.jvp or jax.jacfwd "
    "(jax.hessian rather than jax.jacrev(jax.grad(f))).")


def _forward_only(f, message):
  """``f(*leaves) -> tuple``, whose forward mode is served (its jvp) and whose reverse mode (the
  transpose of that jvp) raises ``message``: an identity bound as a linear map that refuses its
  transpose, which JAX transposes first, before the loops it cannot."""
  @jax.custom_jvp
  def run(*leaves):
    return tuple(f(*leaves))

  def rule(primals, tangents):
    outs, d_outs = jax.jvp(lambda *x: tuple(f(*x)), primals, tangents)
    return outs, tuple(linear(_identity, functools.partial(refuse, message), (outs,),
                              tuple(d_outs), like=outs))
  run.defjvp(rule)
  return run


def _identity(residuals, tangents):
  del residuals
  return tuple(tangents)


def refuse(message, residuals, arrays):
  """A ``fn`` or ``transpose`` for ``linear`` that is never served: raises ``message`` (bind it
  with functools.partial)."""
  del residuals, arrays
  raise ValueError(message)


def _over_batch(f, batch, extra=0):
  """``f`` vmapped once per level of ``batch`` (innermost first; each level: per operand, 0 where
  it is batched at that level, None where not), every output batched; ``extra`` operands after
  the leaves (cotangents) batched at every level."""
  for axes, _ in batch:
    f = jax.vmap(f, in_axes=axes + (0,) * extra)
  return f


def _unbatched_shape(shape, batch, operand):
  """``shape`` of leaf ``operand`` without the levels it is batched at."""
  return tuple(shape)[sum(axes[operand] is not None for axes, _ in batch):]


def _refusing(fn, second_order):
  """``fn``, whose derivative (the kernel's second order, reached through a tangent or a
  transpose evaluated on traced residuals) raises ``second_order``; ``fn`` itself without it."""
  if second_order is None:
    return fn

  @jax.custom_jvp
  def run(*args):
    return fn(*args)

  def refuse(primals, tangents):
    del primals, tangents
    raise ValueError(second_order)
  run.defjvp(refuse)
  return run


def _apply(*leaves, fn, transpose, res_tree, tan_tree, batch, like, derive, second_order):
  del transpose, like, derive
  split = res_tree.num_leaves
  fn = _refusing(fn, second_order)

  def one(*leaves):
    return tuple(fn(jax.tree.unflatten(res_tree, leaves[:split]),
                    jax.tree.unflatten(tan_tree, leaves[split:])))
  return list(_over_batch(one, batch)(*leaves))


def _abstract(*avals, **params):
  if params["like"] is not None:  # every output batched at every level
    batch = params["batch"]
    return [avals[i].update(shape=tuple(size for _, size in reversed(batch))
                            + _unbatched_shape(avals[i].shape, batch, i))
            for i in params["like"]]
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]  # outside shard_map only
  outs = jax.eval_shape(lambda *x: _apply(*x, **params), *shapes)
  return [jax.core.ShapedArray(o.shape, o.dtype) for o in outs]


def _is_second(method) -> bool:
  return isinstance(getattr(method, "__self__", None), _Second)


def _forward_only_pytree(transpose, message):
  """``transpose(residuals, cotangents)`` through ``_forward_only`` (which takes leaves)."""
  def run(residuals, cotangents):
    leaves, tree = jax.tree.flatten((residuals, cotangents))
    out_tree = []

    def flat(*leaves):
      out, treedef = jax.tree.flatten(transpose(*jax.tree.unflatten(tree, leaves)))
      out_tree[:] = [treedef]
      return out
    outs = _forward_only(flat, message)(*leaves)
    return jax.tree.unflatten(out_tree[0], outs)
  return run


def _transpose(cotangents, *leaves, fn, transpose, res_tree, tan_tree, batch, like,
               derive, second_order):
  del fn
  split = res_tree.num_leaves
  if second_order is not None:
    transpose = _refusing(transpose, second_order)
  elif derive is not None or _is_second(transpose):  # a backward: forward mode through it only
    transpose = _forward_only_pytree(transpose, REVERSE_TWICE)
  residuals, tangents = leaves[:split], leaves[split:]
  if any(ad.is_undefined_primal(r) for r in residuals):
    raise NotImplementedError("the kernel's tangent is linear in its tangents only.")
  cotangents = [ad.instantiate_zeros(c) for c in cotangents]

  def one(*args):
    res = jax.tree.unflatten(res_tree, args[:split])
    return jax.tree.leaves(transpose(res, tuple(args[split:])))
  levels = tuple((axes[:split], size) for axes, size in batch)
  grads = _over_batch(one, levels, extra=len(cotangents))(*residuals, *cotangents)
  # a tangent not batched at a level: its cotangent sums over that level's axis
  grads = [g.sum(tuple(depth for depth, (axes, _) in enumerate(reversed(batch))
                       if axes[split + i] is None)).astype(t.aval.dtype)
           for i, (g, t) in enumerate(zip(grads, tangents))]
  return [None] * split + [g if ad.is_undefined_primal(t) else None
                           for g, t in zip(grads, tangents)]


def _jvp(primals, tangents, **params):
  split = params["res_tree"].num_leaves
  outputs = linear_p.bind(*primals, **params)
  lin = [ad.instantiate_zeros(t) for t in tangents[split:]]
  out_tangents = linear_p.bind(*primals[:split], *lin, **params)  # linear in the tangents
  derive, tan_tree = params["derive"], params["tan_tree"]
  # second order, through the residuals: those of the point only where the rest derive from it
  res_tangents = tangents[:tan_tree.num_leaves] if derive is not None else tangents[:split]
  if all(type(t) is ad.Zero for t in res_tangents):
    return outputs, out_tangents
  if params["second_order"] is not None:
    raise ValueError(params["second_order"])
  res_tangents = [ad.instantiate_zeros(t) for t in res_tangents]
  if derive is None:
    at = lambda *r: _apply(*r, *primals[split:], **params)
    if _is_second(params["fn"]):  # third order: forward mode served, reverse over it refused
      at = _forward_only(at, REVERSE_TWICE)
    through = jax.jvp(at, tuple(primals[:split]), tuple(res_tangents))[1]
  else:
    second = _Second(params["fn"], params["transpose"], derive)
    res_tree = jax.tree.structure((jax.tree.unflatten(params["res_tree"], primals[:split]),
                                   jax.tree.unflatten(tan_tree, primals[split:])))
    # the point's tangents are batched where the point is
    batch = tuple((axes + axes[:tan_tree.num_leaves], size) for axes, size in params["batch"])
    through = linear_p.bind(*primals, *res_tangents, fn=second.apply,
                            transpose=second.cotangent, res_tree=res_tree, tan_tree=tan_tree,
                            batch=batch, like=params["like"], derive=None,
                            second_order=None)
  return outputs, [a + b for a, b in zip(out_tangents, through)]


def _batch(args, dims, **params):
  """One more level of batching, outermost: the batched operands' axes moved to the front, the
  unbatched ones left as they are (a vmap over tangents holds one copy of the residuals)."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  axes = tuple(None if d is None else 0 for d in dims)
  params = dict(params, batch=params["batch"] + ((axes, size),))
  outputs = linear_p.bind(*args, **params)
  return outputs, [0] * len(outputs)


linear_p.def_impl(_apply)
linear_p.def_abstract_eval(_abstract)
mlir.register_lowering(linear_p, mlir.lower_fun(_apply, multiple_results=True))
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch
