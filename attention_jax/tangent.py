"""A kernel's tangent as a primitive that is linear in its tangents and transposes to the
kernel's own backward pass: forward mode (jvp, jacfwd) through a memory-efficient kernel
without giving up the hand-written reverse mode.

A ``jax.custom_vjp`` kernel refuses forward mode; a ``jax.custom_jvp`` one gets reverse mode
by transposing its tangent, which JAX would do through the tangent's blockwise loops (slower and
holding more than the backward pass). ``linear`` binds one primitive instead:

  outputs = fn(residuals, tangents)           linear in ``tangents``
  transpose(residuals, cotangents) -> cotangents of ``tangents``   the kernel's backward

so ``grad`` (linearize, then transpose) runs ``transpose``, and ``jvp`` runs ``fn``. Forward
over reverse differentiates ``transpose``; reverse over forward transposes ``fn``'s derivative in
its residuals, which needs ``fn`` itself transposable by JAX.

>>> w = jnp.array([[1.0, 2.0], [3.0, 4.0]])
>>> apply = lambda res, t: (res[0] @ t[0],)
>>> back = lambda res, ct: (res[0].T @ ct[0],)
>>> f = lambda x: linear(apply, back, (w,), (x,))[0]
>>> jax.grad(lambda x: f(x).sum())(jnp.ones(2))
Array([4., 6.], dtype=float32)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

linear_p = core.Primitive("linear_tangent")
linear_p.multiple_results = True


def linear(fn, transpose, residuals, tangents, like=None):
  """``fn(residuals, tangents)`` (a tuple of arrays, linear in the pytree ``tangents``), whose
  transpose is ``transpose(residuals, cotangents)`` (a pytree like ``tangents``). ``fn`` and
  ``transpose`` must be hashable (module functions, or functools.partial of hashable values).
  ``like``: residuals whose types (shape, dtype and, under shard_map, the axes they vary over)
  the outputs have; without it ``fn`` is traced for its output shapes, which serves only
  outside shard_map."""
  res_leaves, res_tree = jax.tree.flatten(residuals)
  tan_leaves, tan_tree = jax.tree.flatten(tangents)
  like = None if like is None else tuple(
      next(i for i, leaf in enumerate(res_leaves) if leaf is x) for x in like)
  return linear_p.bind(*res_leaves, *tan_leaves, fn=fn, transpose=transpose, res_tree=res_tree,
                       tan_tree=tan_tree, batch_rank=0, like=like)


def _over_batch(f, batch_rank):
  for _ in range(batch_rank):
    f = jax.vmap(f)
  return f


def _apply(*leaves, fn, transpose, res_tree, tan_tree, batch_rank, like):
  del transpose, like
  split = res_tree.num_leaves

  def one(*leaves):
    return tuple(fn(jax.tree.unflatten(res_tree, leaves[:split]),
                    jax.tree.unflatten(tan_tree, leaves[split:])))
  return list(_over_batch(one, batch_rank)(*leaves))


def _abstract(*avals, **params):
  if params["like"] is not None:
    return [avals[i] for i in params["like"]]
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]  # outside shard_map only
  outs = jax.eval_shape(lambda *x: _apply(*x, **params), *shapes)
  return [jax.core.ShapedArray(o.shape, o.dtype) for o in outs]


def _transpose(cotangents, *leaves, fn, transpose, res_tree, tan_tree, batch_rank, like):
  split = res_tree.num_leaves
  residuals, tangents = leaves[:split], leaves[split:]
  if any(ad.is_undefined_primal(r) for r in residuals):
    raise NotImplementedError("the kernel's tangent is linear in its tangents only.")
  cotangents = [ad.instantiate_zeros(c) for c in cotangents]

  def one(*args):
    res = jax.tree.unflatten(res_tree, args[:split])
    return jax.tree.leaves(transpose(res, tuple(args[split:])))
  grads = _over_batch(one, batch_rank)(*residuals, *cotangents)
  grads = [g.astype(t.aval.dtype) for g, t in zip(grads, tangents)]
  return [None] * split + [g if ad.is_undefined_primal(t) else None
                           for g, t in zip(grads, tangents)]


def _jvp(primals, tangents, **params):
  split = params["res_tree"].num_leaves
  outputs = linear_p.bind(*primals, **params)
  lin = [ad.instantiate_zeros(t) for t in tangents[split:]]
  out_tangents = linear_p.bind(*primals[:split], *lin, **params)  # linear in the tangents
  res_tangents = tangents[:split]
  if not all(type(t) is ad.Zero for t in res_tangents):  # second order: through the residuals
    res_tangents = [ad.instantiate_zeros(t) for t in res_tangents]
    through = jax.jvp(lambda *r: _apply(*r, *primals[split:], **params), tuple(primals[:split]),
                      tuple(res_tangents))[1]
    out_tangents = [a + b for a, b in zip(out_tangents, through)]
  return outputs, out_tangents


def _batch(args, dims, **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  args = [jnp.broadcast_to(a, (size,) + a.shape) if d is None
          else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
  params = dict(params, batch_rank=params["batch_rank"] + 1)
  outputs = linear_p.bind(*args, **params)
  return outputs, [0] * len(outputs)


linear_p.def_impl(_apply)
linear_p.def_abstract_eval(_abstract)
mlir.register_lowering(linear_p, mlir.lower_fun(_apply, multiple_results=True))
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch
