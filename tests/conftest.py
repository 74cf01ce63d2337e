import numpy as np


def assert_close(actual, expected, rtol=1e-5, name=""):
  """max |actual - expected| <= rtol * max |expected| (relative to the array's scale)."""
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
  assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
  scale = max(np.max(np.abs(expected)), 1e-30) if expected.size else 1.0
  error = np.max(np.abs(actual - expected)) if expected.size else 0.0
  assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} * {scale:.3g}"
