"""The dense layers' product (attention_jax/products.py): x W, with x W's derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from attention_jax.products import dense_dot_general, dense_product
from conftest import assert_close

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 5, 6)).astype(np.float32)  # [B, T, D_in]
KERNEL = RNG.standard_normal((6, 3, 4)).astype(np.float32)  # [D_in, N, H]


def test_dense_product_is_x_times_the_kernel():
  expected = np.einsum("btd,dnh->btnh", X.astype(np.float64), KERNEL.astype(np.float64))
  assert_close(dense_product(X, KERNEL), expected, 1e-6)


@pytest.mark.parametrize("mode", ["grad", "jvp", "vmap of grad", "hessian-vector"])
def test_dense_product_has_the_derivatives_of_the_plain_product(mode):
  plain = lambda x, w: jnp.sum(jnp.tanh(jnp.einsum("btd,dnh->btnh", x, w)))
  ours = lambda x, w: jnp.sum(jnp.tanh(dense_product(x, w)))
  tangents = (np.ones_like(X), np.ones_like(KERNEL))
  run = {
      "grad": lambda f: jax.grad(f, argnums=(0, 1))(X, KERNEL),
      "jvp": lambda f: jax.jvp(f, (X, KERNEL), tangents),
      "vmap of grad": lambda f: jax.vmap(jax.grad(f, argnums=1), in_axes=(0, None))(
          X[:, None], KERNEL),
      "hessian-vector": lambda f: jax.jvp(jax.grad(f, argnums=1), (X, KERNEL), tangents)[1],
  }[mode]
  for got, expected in zip(jax.tree.leaves(run(ours)), jax.tree.leaves(run(plain))):
    assert_close(got, expected, 1e-5)


def test_dense_dot_general_serves_dense_layers_and_passes_other_products_on():
  matrix = KERNEL.reshape(6, 12)
  dense = (((2,), (0,)), ((), ()))
  assert_close(dense_dot_general(X, matrix, dense), lax.dot_general(X, matrix, dense), 1e-6)
  batched = (((2,), (1,)), ((0,), (0,)))  # not a dense layer's product: lax.dot_general's
  other = RNG.standard_normal((2, 6, 7)).astype(np.float32)
  assert_close(dense_dot_general(X, other, batched), lax.dot_general(X, other, batched), 1e-6)
