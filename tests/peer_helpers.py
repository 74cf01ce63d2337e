"""Helpers shared by the ports of the peers' own attention tests (tests/test_peer_*.py): the
implementations every port runs on, jax's closeness rule, seeded draws in any dtype and the
float64 NumPy reference called on such draws."""

import jax
import jax.numpy as jnp
import numpy as np

import numpy_reference

# Every implementation that runs on CPU, and the automatic choice (None).
IMPLEMENTATIONS = ("reference", "xla", "chunked", None)
IMPLEMENTATION_IDS = [str(name) if name else "auto" for name in IMPLEMENTATIONS]

# jax's default tolerances per dtype (jax._src.public_test_util), for the asserts that upstream
# writes without one.
DEFAULT_TOLERANCE = {jnp.dtype(jnp.bfloat16): 1e-2, jnp.dtype(jnp.float16): 1e-3,
                     jnp.dtype(jnp.float32): 1e-6, jnp.dtype(jnp.float64): 1e-15}


def allclose(actual, desired, *, atol=None, rtol=None, name=""):
  """The rule of jax's ``assertAllClose``: |actual - desired| <= atol + rtol * |desired| at every
  element, compared in float64, and the same shape (dtypes are the caller's to check). A
  tolerance left out is jax's default for the coarser of the two dtypes."""
  dtypes = (np.asarray(actual).dtype, np.asarray(desired).dtype)
  default = max(DEFAULT_TOLERANCE.get(dtype, 0.0) for dtype in dtypes)
  atol, rtol = default if atol is None else atol, default if rtol is None else rtol
  actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  assert actual.shape == desired.shape, f"{name}: shape {actual.shape} != {desired.shape}"
  np.testing.assert_allclose(actual, desired, atol=atol, rtol=rtol, err_msg=name)


def max_error(actual, expected) -> float:
  """max |actual - expected|, in float64."""
  return float(np.max(np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))))


def normal(seed, shape, dtype=jnp.float32):
  """Standard normal draws rounded to ``dtype`` (NumPy's generator: nothing to compile per
  shape, as jax.random's samplers would on CPU)."""
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def refuses_float16(implementation, dtype) -> bool:
  """Whether the call is one we refuse up front: float16 through jax.nn ("xla") on CPU, where
  XLA cannot compile jax.nn's F16_F16_F32 products under jit."""
  return (implementation == "xla" and jnp.dtype(dtype) == jnp.float16
          and jax.default_backend() == "cpu")


def float64_attention(query, key, value, bias=None, mask=None, d_output=None, **options):
  """(output, log-sum-exp [..., T, N], (d_query, d_key, d_value, d_bias)) in float64 from
  tests/numpy_reference.py; the gradients are those of sum(output * d_output) (None without
  ``d_output``). ``options``: scale, is_causal, logits_soft_cap."""
  as64 = lambda x: None if x is None else np.asarray(x, np.float64)
  mask = None if mask is None else np.asarray(mask, bool)
  output, _, cache = numpy_reference.attention(as64(query), as64(key), as64(value), as64(bias),
                                               mask, **options)
  grads = None if d_output is None else numpy_reference.attention_vjp(cache, as64(d_output))
  return output, numpy_reference.log_sum_exp(cache), grads


def allowed_positions(batch, q_len, kv_len, *, is_causal=False, window=None, q_lengths=None,
                      kv_lengths=None, q_segments=None, kv_segments=None):
  """[batch, 1, T, S] bool: where query t may attend to key s under jax.nn's structure arguments
  (top-left causal, (left, right) window, sequence lengths, segment ids), written with NumPy
  broadcasting (numpy_reference.structure_mask is the same rule, element by element)."""
  t, s = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  allowed = np.ones((batch, 1, q_len, kv_len), bool)
  if is_causal:
    allowed &= s <= t
  if window is not None:
    allowed &= (t - window[0] <= s) & (s <= t + window[1])
  if q_lengths is not None:
    allowed &= t < np.asarray(q_lengths)[:, None, None, None]
  if kv_lengths is not None:
    allowed &= s < np.asarray(kv_lengths)[:, None, None, None]
  if q_segments is not None:
    allowed &= (np.asarray(q_segments)[:, None, :, None]
                == np.asarray(kv_segments)[:, None, None, :])
  return allowed
