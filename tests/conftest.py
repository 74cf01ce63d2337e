import os

# Before jax is imported, and in the environment, so that the runs the tests start as
# subprocesses compute as the in-process ones do.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The tests check the mathematics against float64 references at float32 tolerances, so float32
# matrix products must be float32 on every backend. JAX's default on NVIDIA GPUs (and TPUs)
# rounds their inputs to TF32 (bfloat16 passes on TPU), whose errors are about 3e-4 relative;
# tests/test_gpu.py checks the default precision separately, at its own tolerance.
jax.config.update("jax_default_matmul_precision", "highest")  # if jax was imported before


def assert_close(actual, expected, rtol=1e-5, name=""):
  """max |actual - expected| <= rtol * max |expected| (relative to the array's scale)."""
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
  assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
  scale = max(np.max(np.abs(expected)), 1e-30) if expected.size else 1.0
  error = np.max(np.abs(actual - expected)) if expected.size else 0.0
  assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} * {scale:.3g}"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """A TFDS data_dir shared by every test that generates a task (each config once)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="session")
def reference_run(data_dir, tmp_path_factory):
  """One uninterrupted tiny run (workdir, final metrics), shared by the tests that compare with
  it. Tests copy it before changing anything in it."""
  from experiments import train
  from training_helpers import tiny_config
  workdir = str(tmp_path_factory.mktemp("reference"))
  final = train.train_and_evaluate(tiny_config(data_dir, attention_maps=1), workdir)
  return workdir, final
