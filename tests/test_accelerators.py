"""The GPU (cuDNN) and TPU (Pallas) paths and the automatic choice between implementations.

No accelerator is needed: the Pallas TPU kernel runs in Pallas' interpret mode on the CPU, and the
cuDNN wrapper is checked twice, with the same prepared inputs going through jax.nn's XLA path
(values and gradients against the float64 reference) and through jax's cuDNN front end up to
the kernel call (jax checks shapes, dtypes and layout there while tracing).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import attention_jax as aj
from attention_jax import cudnn
from attention_jax import pallas_tpu
from attention_cases import CASES, assert_case_matches, run_case


def _default_scale(kernel):
  """The kernel with scale=None meaning 1/sqrt(head_dim), as dot_product_attention resolves it."""
  def attention(query, key, value, bias, mask, *, scale, is_causal):
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return kernel(query, key, value, bias, mask, scale=scale, is_causal=is_causal)
  return attention


@pytest.mark.parametrize("case", sorted(CASES))
def test_cudnn_inputs_through_xla_match_float64_reference(case, monkeypatch):
  monkeypatch.setattr(cudnn, "KERNEL", "xla")
  assert_case_matches(run_case(CASES[case], _default_scale(cudnn.cudnn_attention)), 1e-5)


@pytest.mark.parametrize("case", ["basic", "gqa", "fully_masked_rows", "bias_per_head",
                                  "bias_neg_inf", "causal_masked_gqa", "two_batch_dims",
                                  # odd lengths, which jax's cuDNN backward refuses unpadded
                                  "cross_lengths", "causal_cross", "bias_full_and_mask"])
def test_cudnn_inputs_pass_jax_cudnn_checks_forward_and_backward(case, monkeypatch):
  from jax._src.cudnn import fused_attention_stablehlo
  monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90800)
  batch, q_len, kv_len, heads, kv_heads, head_dim, options = CASES[case]
  assert head_dim % 8 == 0
  shape = lambda length, n: jax.ShapeDtypeStruct(batch + (length, n, head_dim), jnp.bfloat16)
  query, key = shape(q_len, heads), shape(kv_len, kv_heads)
  target = batch + (heads, q_len, kv_len)
  mask = jax.ShapeDtypeStruct(target, jnp.bool_) if "mask" in options else None
  bias = jax.ShapeDtypeStruct(target, jnp.float32) if "bias" in options else None
  is_causal = options.get("is_causal", False)
  assert aj.select_implementation(query, key, key, bias, mask, implementation="cudnn",
                                  backend="gpu") == "cudnn"

  def loss(q, k, v, b, m):
    out = cudnn.cudnn_attention(q, k, v, b, m, scale=0.3, is_causal=is_causal)
    return jnp.sum(out.astype(jnp.float32))

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(query, key, key, bias, mask)
  names = {equation.primitive.name for equation in jaxpr.eqns}
  assert {"dot_product_attention_fwd_wrapper", "dot_product_attention_bwd_wrapper"} <= names


PALLAS_CASES = {
    # name: (batch, T, S, N, K, H, options), lengths multiples of the kernel's 128
    "causal_gqa": ((2,), 128, 128, 4, 2, 16, {"is_causal": True}),
    "padding_cross_lengths": ((2,), 128, 256, 2, 2, 16, {"mask": "padding"}),  # segment ids
    "bias_and_mask_empty_rows": ((1,), 128, 128, 2, 2, 16, {"bias": "full", "mask": "random"}),
    "neg_inf_bias_causal_mqa": ((1,), 128, 128, 2, 1, 16, {"bias": "neg_inf", "is_causal": True}),
    "window_segments_lengths_gqa": ((2,), 128, 128, 4, 2, 16, {"mask": "structure",
                                                                "is_causal": True}),
    "two_batch_dims_head_bias_scale": ((2, 1), 128, 128, 2, 2, 16,
                                       {"bias": "heads", "scale": 3.0}),
}


@pytest.mark.parametrize("case", sorted(PALLAS_CASES))
def test_pallas_tpu_kernel_matches_float64_reference_in_interpret_mode(case):
  with pltpu.force_tpu_interpret_mode():
    results = run_case(PALLAS_CASES[case], _default_scale(pallas_tpu.pallas_tpu_attention), seed=len(case))
  assert_case_matches(results, 1e-5)


def test_pallas_tpu_kernel_bfloat16_in_interpret_mode():
  with pltpu.force_tpu_interpret_mode():
    results = run_case(PALLAS_CASES["causal_gqa"], _default_scale(pallas_tpu.pallas_tpu_attention),
                       dtype=jnp.bfloat16)
  assert_case_matches(results, 3e-2)


def _shapes(q_len, head_dim=64, dtype=jnp.float32, kv_len=None):
  query = jax.ShapeDtypeStruct((2, q_len, 8, head_dim), dtype)
  key = jax.ShapeDtypeStruct((2, kv_len or q_len, 8, head_dim), dtype)
  return query, key, key


H100 = "NVIDIA H100 80GB HBM3"  # where cuDNN has been measured (KERNELS["cudnn"].measured_on)


@pytest.mark.parametrize("backend, device_kind, shapes, options, expected", [
    ("cpu", "cpu", _shapes(64), {}, "reference"),
    ("cpu", "cpu", _shapes(64, kv_len=aj.attention.CHUNKED_MIN_LENGTH_CPU), {}, "chunked"),
    ("cpu", "cpu", _shapes(1024), {"dropout_rate": 0.1}, "chunked"),  # counter-based masks
    ("cpu", "cpu", _shapes(64), {"dropout_rate": 0.1}, "reference"),  # flax's masks
    ("gpu", H100, _shapes(100, dtype=jnp.bfloat16), {}, "cudnn"),
    ("gpu", H100, _shapes(64, dtype=jnp.float16), {"mask": np.ones((64, 64), bool)}, "cudnn"),
    ("gpu", H100, _shapes(64), {}, "xla"),  # float32: cuDNN's flash kernel takes 16-bit floats
    ("gpu", H100, _shapes(63, dtype=jnp.bfloat16), {}, "cudnn"),  # odd lengths are padded
    ("gpu", H100, _shapes(8192), {}, "chunked"),  # 2 x 8 x 8192^2 float32 logits: 4 GiB
    ("gpu", H100, _shapes(64, head_dim=12, dtype=jnp.bfloat16), {}, "xla"),
    ("gpu", H100, _shapes(63, dtype=jnp.bfloat16), {"bias": np.zeros((63, 63))}, "cudnn"),
    ("gpu", H100, _shapes(64, dtype=jnp.bfloat16), {"return_weights": True}, "reference"),
    ("gpu", H100, _shapes(64, dtype=jnp.bfloat16), {"logits_soft_cap": 30.0}, "pallas_gpu"),
    ("gpu", "NVIDIA A100-SXM4-40GB", _shapes(64, dtype=jnp.bfloat16), {"logits_soft_cap": 30.0},
     "chunked"),  # the fused kernel is chosen only where it was timed
    ("gpu", H100, _shapes(64, dtype=jnp.bfloat16), {"dropout_rate": 0.1}, "reference"),
    ("gpu", H100, _shapes(8192, dtype=jnp.bfloat16), {"dropout_rate": 0.1}, "chunked"),
    ("gpu", H100, _shapes(64, dtype=jnp.bfloat16), {"return_residual": True}, "cudnn"),
    ("gpu", "NVIDIA H200", _shapes(100, dtype=jnp.bfloat16), {}, "cudnn"),  # Hopper, as H100
    ("gpu", "NVIDIA GH200 480GB", _shapes(100, dtype=jnp.bfloat16), {}, "cudnn"),
    ("gpu", "NVIDIA A100-SXM4-40GB", _shapes(100, dtype=jnp.bfloat16), {}, "xla"),  # Ampere
    ("gpu", "Tesla T4", _shapes(100, dtype=jnp.bfloat16), {}, "xla"),  # cuDNN not measured there
    ("gpu", "NVIDIA Future GPU", _shapes(100, dtype=jnp.bfloat16), {}, "xla"),  # unknown
    ("tpu", "TPU v4", _shapes(4096), {}, "xla"),  # the Pallas kernel has not run on a TPU yet
    ("tpu", "TPU v2", _shapes(1000), {}, "xla"),
    ("tpu", "TPU v5 lite", _shapes(2048, head_dim=192), {"return_residual": True}, "xla"),
])
def test_automatic_choice_per_backend(backend, device_kind, shapes, options, expected):
  options = dict(options)
  bias, mask = options.pop("bias", None), options.pop("mask", None)
  assert aj.select_implementation(*shapes, bias, mask, backend=backend, device_kind=device_kind,
                                  **options) == expected


@pytest.mark.parametrize("compute_capability, expected", [
    ("9.0", "cudnn"), ("8.0", "xla"), ("8.9", "xla"), ("10.0", "xla"), (None, "xla")])
def test_automatic_choice_on_gpu_follows_the_architecture(compute_capability, expected):
  """The device's own compute capability decides, whatever its name says (an unknown kind)."""
  shapes = _shapes(128, dtype=jnp.bfloat16)
  assert aj.select_implementation(*shapes, backend="gpu", device_kind="NVIDIA Future GPU",
                                  compute_capability=compute_capability) == expected


def test_a_kind_asked_about_on_a_gpu_host_is_not_overridden_by_the_host_device(monkeypatch):
  """On an H200 host, asking about an A100 must answer for the A100 (the host's own compute
  capability is used only when neither a kind nor a capability is given)."""
  class H200:
    device_kind, compute_capability = "NVIDIA H200", "9.0"
  monkeypatch.setattr(aj.attention, "_device", lambda backend: H200())
  shapes = _shapes(100, dtype=jnp.bfloat16)
  assert aj.select_implementation(*shapes, backend="gpu") == "cudnn"
  assert aj.select_implementation(*shapes, backend="gpu",
                                  device_kind="NVIDIA A100-SXM4-80GB") == "xla"
  assert aj.select_implementation(*shapes, backend="gpu", device_kind="Tesla T4") == "xla"


def test_float16_on_xla_is_refused_on_cpu_in_one_line():
  shapes = _shapes(64, dtype=jnp.float16)
  with pytest.raises(ValueError, match="cannot run float16 on the CPU backend"):
    aj.select_implementation(*shapes, implementation="xla", backend="cpu")
  assert aj.select_implementation(*shapes, implementation="xla", backend="gpu") == "xla"


@pytest.mark.parametrize("implementation, backend, shapes, match", [
    ("cudnn", "cpu", _shapes(64, dtype=jnp.bfloat16), "only on the gpu backend"),
    ("pallas_tpu", "gpu", _shapes(1024), "only on the tpu backend"),
    ("cudnn", "gpu", _shapes(64), "float16 or bfloat16"),
    ("pallas_tpu", "tpu", _shapes(100), "multiples of 128"),
    ("pallas_tpu", "tpu", _shapes(1024), "does not compile on TPU v3"),
    ("cudnn", "gpu", _shapes(64, dtype=jnp.bfloat16), "no logits soft cap"),
    ("pallas_tpu", "tpu", _shapes(1024), "does not return the log-sum-exp"),
])
def test_named_accelerator_kernel_that_cannot_serve_raises(implementation, backend, shapes,
                                                           match):
  options = {"device_kind": "TPU v3"} if "TPU v3" in match else {}
  options.update({"logits_soft_cap": 5.0} if "soft cap" in match else {})
  options.update({"return_residual": True} if "log-sum-exp" in match else {})
  with pytest.raises(ValueError, match=match):
    aj.select_implementation(*shapes, implementation=implementation, backend=backend, **options)


def test_dot_product_attention_refuses_accelerator_kernel_of_another_backend():
  query = jnp.zeros((1, 128, 2, 16), jnp.bfloat16)
  for implementation, kernel in aj.attention.KERNELS.items():
    if kernel.backend in (None, jax.default_backend()):
      continue
    with pytest.raises(ValueError, match="cannot serve this call"):
      aj.dot_product_attention(query, query, query, implementation=implementation)


@pytest.mark.parametrize("implementation", ["cudnn", "pallas_tpu"])
def test_a_named_accelerator_kernel_serves_a_mask_mod_as_a_dense_mask(implementation,
                                                                      monkeypatch):
  """Off their backend (cuDNN's inputs through jax.nn's XLA path, the Pallas kernel in interpret
  mode), a document mask_mod equals the reference's, and the automatic choice does not pick them
  for it."""
  monkeypatch.setattr(cudnn, "KERNEL", "xla")
  monkeypatch.setitem(aj.attention.KERNELS, implementation, dataclasses.replace(
      aj.attention.KERNELS[implementation], backend=jax.default_backend()))
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 128, 2, 16)), jnp.bfloat16) for _ in range(3))
  docs = jnp.repeat(jnp.arange(4), 32)
  same_doc = lambda b, h, q_idx, kv_idx: docs[q_idx] == docs[kv_idx]
  expected = aj.dot_product_attention(q, k, v, mask_mod=same_doc, is_causal=True,
                                      implementation="reference")
  with pltpu.force_tpu_interpret_mode():
    got = aj.dot_product_attention(q, k, v, mask_mod=same_doc, is_causal=True,
                                   implementation=implementation)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32),
                             atol=2e-2)
  assert aj.select_implementation(q, k, v, mask_mod=same_doc, backend="gpu",
                                  device_kind="NVIDIA H100") == "pallas_gpu"  # the fused kernel
