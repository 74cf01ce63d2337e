"""Doctest setup for the docstrings' examples (pytest --doctest-modules, see pyproject.toml).

Every example may use ``jax``, ``jnp``, ``np`` and ``nnx`` without importing them; any other
name it uses it defines itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

# Modules that cannot be imported merely to collect their docstrings: command-line programs whose
# flags or backends are set up at import time. (They have no examples.)
collect_ignore_glob = []


@pytest.fixture(scope="session", autouse=True)
def _doctest_names(doctest_namespace):
  doctest_namespace.update(jax=jax, jnp=jnp, np=np, nnx=nnx)
