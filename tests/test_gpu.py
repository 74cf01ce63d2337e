"""On an NVIDIA GPU: cuDNN flash attention itself, and float32 at JAX's default matmul precision.

Skipped unless JAX's default backend is a GPU. test_accelerators.py checks the cuDNN wrapper's
inputs on any machine; here the kernel runs, forward and backward, against the float64 reference.
"""

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from attention_cases import CASES, assert_case_matches, attention, random_case, run_case
from conftest import assert_close

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")

# bfloat16 keeps 8 significant bits, float16 11: the probabilities and the output are rounded to
# them inside the kernel (the inputs are rounded before the reference sees them).
TOLERANCE = {jnp.bfloat16: 3e-2, jnp.float16: 1e-2}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cudnn_kernel_matches_float64_reference(case, dtype):
  """Every case of the contract, odd lengths (padded by the wrapper) included."""
  kernel = functools.partial(attention, implementation="cudnn")
  results = run_case(CASES[case], kernel, seed=zlib.crc32(case.encode()) % 1000, dtype=dtype)
  assert_case_matches(results, TOLERANCE[dtype])


@pytest.mark.parametrize("q_len, kv_len, heads, kv_heads, head_dim, options", [
    (1024, 1024, 8, 8, 64, {"is_causal": True}),
    (512, 768, 8, 2, 128, {"mask": "padding"}),  # GQA, padded keys, the largest head dim
    (256, 256, 4, 1, 32, {"bias": "heads", "is_causal": True}),  # MQA with an ALiBi-like bias
    (130, 130, 4, 4, 8, {"mask": "random"}),  # lengths off the kernel's tiles, empty rows
])
def test_cudnn_kernel_at_model_sizes(q_len, kv_len, heads, kv_heads, head_dim, options):
  case = ((2,), q_len, kv_len, heads, kv_heads, head_dim, options)
  kernel = functools.partial(attention, implementation="cudnn")
  assert_case_matches(run_case(case, kernel, seed=q_len, dtype=jnp.bfloat16), 3e-2)


def test_fully_masked_rows_are_zero_with_finite_gradients_through_cudnn():
  query, key, value, _, _ = random_case(0, (2,), 8, 8, 2, 2, 16)
  query, key, value = (jnp.asarray(x, jnp.bfloat16) for x in (query, key, value))
  mask = np.ones((2, 2, 8, 8), bool)
  mask[0, 1, 2] = False
  mask[1] = False
  fn = lambda q, k, v: aj.dot_product_attention(q, k, v, mask=mask, implementation="cudnn",
                                                empty_rows="zero")
  output = fn(query, key, value)
  np.testing.assert_array_equal(np.asarray(output[0, 2, 1], np.float32), 0.0)
  np.testing.assert_array_equal(np.asarray(output[1], np.float32), 0.0)
  grads = jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2))(
      query, key, value)
  for grad in grads:
    assert np.all(np.isfinite(np.asarray(grad, np.float32)))
  np.testing.assert_array_equal(np.asarray(grads[0][1], np.float32), 0.0)


def test_automatic_choice_on_this_gpu_runs():
  """cuDNN is chosen automatically only on the GPU architectures where it has been measured."""
  query = jnp.zeros((2, 128, 4, 64), jnp.bfloat16)
  device = jax.devices()[0]
  arch = aj.attention.architecture("gpu", device.device_kind,
                                   getattr(device, "compute_capability", None))
  measured = arch in aj.attention.KERNELS["cudnn"].measured_on
  assert aj.select_implementation(query, query, query) == ("cudnn" if measured else "xla")
  query_32 = query.astype(jnp.float32)
  assert aj.select_implementation(query_32, query_32, query_32) == "xla"
  assert aj.dot_product_attention(query, query, query).dtype == jnp.bfloat16


@pytest.mark.parametrize("implementation", ["reference", "xla", "chunked"])
def test_float32_at_default_precision_is_within_tf32_error(implementation):
  """JAX's default precision on NVIDIA GPUs rounds float32 matmul inputs to TF32 (10-bit
  mantissa): about 3e-4 relative error, not float32's 1e-6 (conftest sets "highest")."""
  case = CASES["causal_masked_gqa"]
  fn = functools.partial(attention, implementation=implementation)
  with jax.default_matmul_precision("default"):
    assert_case_matches(run_case(case, fn, seed=3), 3e-3)


@pytest.mark.parametrize("implementation", ["cudnn", None])
def test_packed_sequences_through_cudnn_match_the_reference(implementation):
  """Segment ids (packed sequences) reach cuDNN as part of its mask, so none is dropped: a large
  JAX project's cuDNN path once ignored them. Also through the automatic choice (cuDNN here)."""
  rng = np.random.default_rng(5)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal((2, 256, 4, 64)), jnp.bfloat16)
                        for _ in range(4))
  ids = jnp.asarray(np.sort(rng.integers(0, 5, (2, 256)), axis=-1))  # up to 5 per row
  kwargs = dict(query_segment_ids=ids, key_segment_ids=ids, is_causal=True)
  fn = lambda q, k, v: aj.dot_product_attention(  # noqa: E731
      q, k, v, implementation=implementation, **kwargs)
  dense = lambda q, k, v: aj.dot_product_attention(  # noqa: E731
      *(x.astype(jnp.float32) for x in (q, k, v)), implementation="reference", **kwargs)
  run = lambda f: jax.jit(lambda *a: (f(*a), jax.grad(  # noqa: E731
      lambda *b: jnp.sum(f(*b).astype(jnp.float32) * cotangent.astype(jnp.float32)),
      (0, 1, 2))(*a)))(q, k, v)
  (out, grads), (want, want_grads) = run(fn), run(dense)
  assert_close(out, want, rtol=3e-2, name="output")
  for name, got, expected in zip("qkv", grads, want_grads):
    assert_close(got, expected, rtol=3e-2, name=f"d{name}")
  # a segment's rows see nothing of another segment: moving another segment's values moves none
  moved = v + jnp.where((ids == 0)[..., None, None], 0.0, 10.0).astype(jnp.bfloat16)
  first = np.asarray(ids == 0)
  np.testing.assert_array_equal(np.asarray(fn(q, k, moved), np.float32)[first],
                                np.asarray(fn(q, k, v), np.float32)[first])
