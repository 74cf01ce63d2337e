"""The dense layers' matrix product x W, in the form XLA's CPU backend differentiates fastest.

It is x W, computed as a ``dot_general`` with a batch dimension of size one on both sides. The
forward product is the same; the weight gradient dW = X^T dY that autodiff derives from it takes
the form (dY^T X)^T, which XLA's CPU backend runs as a plain matrix product (why, and the
measurement: docs/performance_history.md, "2026-11-23, second round"). Every derivative (grad,
jvp, vmap, higher orders) is that of x @ W.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def dense_product(x, kernel, *, precision=None, preferred_element_type=None):
  """x [..., D_in] times kernel ``[D_in, *F]`` -> ``[..., *F]``.

  >>> x, kernel = jnp.ones((2, 10, 64)), jnp.ones((64, 8, 8))  # [B, T, D_in], [D_in, N, H]
  >>> dense_product(x, kernel).shape  # [B, T, N, H]
  (2, 10, 8, 8)
  """
  matrix = jnp.reshape(kernel, (kernel.shape[0], -1))  # [D_in, F]
  y = lax.dot_general(x[None], matrix[None], (((x.ndim,), (1,)), ((0,), (0,))),
                      precision=precision, preferred_element_type=preferred_element_type)
  return jnp.reshape(y[0], x.shape[:-1] + kernel.shape[1:])  # [1, ..., F] -> [..., *F]


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                      **options):
  """The ``dot_general`` of ``flax.linen.Dense`` and ``flax.nnx.Linear``: their product, lhs
  [..., D_in] with kernel [D_in, F], as ``dense_product``; any other as ``lax.dot_general``."""
  (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
  if (tuple(lhs_contracting) == (lhs.ndim - 1,) and tuple(rhs_contracting) == (0,)
      and not tuple(lhs_batch) and not tuple(rhs_batch) and rhs.ndim == 2 and not options):
    return dense_product(lhs, rhs, precision=precision,
                         preferred_element_type=preferred_element_type)
  return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type, **options)
