"""Token embeddings whose gradient is the same bit for bit on every run, on every backend.

The gradient of a lookup ``table[tokens]`` (``jnp.take``, as flax's ``Embed`` does) is a
scatter-add of the output's cotangent into the table's rows. XLA:GPU runs a scatter-add with
atomic additions, whose order, and so whose float rounding, changes from run to run: on an H200
two runs of the same 20 training steps of the default model ended with different parameters
(``scripts/determinism_check.py``), and a run resumed from a checkpoint did not repeat the
uninterrupted one. Here the table's gradient on a GPU is instead the product of the tokens'
one-hot codes with the cotangent, d_table = onehot(tokens)^T dY, a matrix product in a fixed
order, computed exactly (float32 products of 0s and 1s, ``Precision.HIGHEST``), in blocks of
``VOCAB_BLOCK`` rows of the table so that the one-hot codes stay small. It costs 2 V N D FLOPs for
N tokens, V rows and D features; CPUs and TPUs keep the scatter, which is deterministic there.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

VOCAB_BLOCK = 2048

#: None: the one-hot gradient on GPUs only; True or False: everywhere or nowhere.
DETERMINISTIC_GRADIENT: bool | None = None


def uses_one_hot_gradient() -> bool:
  if DETERMINISTIC_GRADIENT is None:
    return jax.default_backend() == "gpu"
  return DETERMINISTIC_GRADIENT


def lookup(table, tokens):
  """``table[tokens]``: table [V, D], integer tokens [...] -> [..., D]. Its gradient with
  respect to the table is deterministic (see the module's text); ``tokens`` get none.

  >>> table = jnp.arange(6.0).reshape(3, 2)
  >>> lookup(table, jnp.array([[2, 0]]))
  Array([[[4., 5.],
          [0., 1.]]], dtype=float32)
  >>> jax.grad(lambda t: lookup(t, jnp.array([1, 1, 2])).sum())(table)[:, 0]
  Array([0., 2., 1.], dtype=float32)
  """
  if not uses_one_hot_gradient():
    return jnp.take(table, tokens, axis=0)
  return _one_hot_gradient_lookup(table, tokens)


@jax.custom_vjp
def _one_hot_gradient_lookup(table, tokens):
  return jnp.take(table, tokens, axis=0)


def _forward(table, tokens):
  return jnp.take(table, tokens, axis=0), (table, tokens)


def _backward(residuals, d_output):
  table, tokens = residuals
  vocab, features = table.shape
  tokens = jnp.reshape(tokens, (-1,))  # [N]
  d_output = jnp.reshape(d_output, (-1, features)).astype(jnp.float32)  # [N, D]
  block = min(vocab, VOCAB_BLOCK)
  blocks = -(-vocab // block)

  def rows(start):  # d_table[start : start + block] = onehot(tokens - start)^T dY: [block, D]
    one_hot = jax.nn.one_hot(tokens - start, block, dtype=jnp.float32)  # [N, block]
    return jnp.matmul(one_hot.T, d_output, precision=lax.Precision.HIGHEST)
  d_table = lax.map(rows, jnp.arange(blocks) * block)  # [blocks, block, D]
  d_table = jnp.reshape(d_table, (blocks * block, features))[:vocab]  # [V, D]
  return d_table.astype(table.dtype), None


_one_hot_gradient_lookup.defvjp(_forward, _backward)


def embed(table, tokens):
  """``lookup`` for the modules below, which refuse token ids that are not integers."""
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"token ids must be integers, got {tokens.dtype}")
  return lookup(table, tokens)


class Embed(nn.Embed):
  """``flax.linen.Embed`` (same parameters, same outputs) whose table gradient is deterministic
  on GPUs (``lookup``)."""

  def __call__(self, inputs):
    (table,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
    return embed(table, inputs)
