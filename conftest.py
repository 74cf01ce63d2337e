"""Doctest setup for the docstrings' examples (pytest --doctest-modules, see pyproject.toml).

Every example may use ``jax``, ``jnp``, ``np`` and ``nnx`` without importing them; any other
name it uses it defines itself.
"""

import pytest

# Nothing is imported here at module level: tests/conftest.py sets JAX's environment (compilation
# cache, matmul precision) before JAX is first imported, and this file is loaded before it.


@pytest.fixture(scope="session", autouse=True)
def _doctest_names(doctest_namespace):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  doctest_namespace.update(jax=jax, jnp=jnp, np=np, nnx=nnx)
