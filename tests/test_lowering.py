"""The default training step and the library's attention lower for a TPU and for a CUDA GPU on
this CPU, with the implementation the automatic choice makes on each (Colab runs both), so that a
change which breaks either fails here and not on a user's Colab. Lowering is jax's
``.trace(...).lower(lowering_platforms=...)``; newer JAX asks which GPU to lower for, and gets an
abstract H100. The Pallas TPU kernel itself runs in interpret mode in test_accelerators.py, the
Triton kernels lower for CUDA in test_pallas_gpu.py."""

import jax
import jax.numpy as jnp
import pytest

import attention_jax as aj
from experiments import config_check, train
from experiments import replicas as replicas_lib
from training_helpers import set_field

pytestmark = pytest.mark.quick

# platform to lower for -> (jax's backend name, device kind, compute capability) it stands for
PLATFORMS = {"tpu": ("tpu", "TPU v5 lite", None), "cuda": ("gpu", "NVIDIA H100 80GB HBM3", "9.0")}


def _lower(function, *shapes, platform):
  """``function`` jitted, traced at ``shapes`` and lowered for ``platform``."""
  lower = lambda: function.trace(*shapes).lower(lowering_platforms=(platform,))
  try:
    return lower()
  except RuntimeError as error:
    if platform != "cuda" or "abstract GPU device" not in str(error):
      raise
  device = jax.sharding.AbstractDevice(device_kind=PLATFORMS[platform][1], num_cores=132,
                                       platform="gpu")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",),
                                                                abstract_device=device)):
    return lower()


def _chosen(shape, dtype, platform, **call):
  backend, kind, capability = PLATFORMS[platform]
  q = jax.ShapeDtypeStruct(shape, dtype)
  return aj.select_implementation(q, q, q, backend=backend, device_kind=kind,
                                  compute_capability=capability, **call)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_the_default_training_step_lowers_with_that_platform_s_attention(platform, data_dir):
  config = config_check.default_config()
  for field, value in {"data_dir": data_dir, "task_options.num_train": 256,
                       "task_options.num_test": 64}.items():
    set_field(config, field, value)
  task, model, tx, init = train.setup(config, replicas_lib.replicas_of(config))
  m = config.model
  length = task.max_length + (m.pooling == "cls")
  config.model.attention_impl = _chosen(
      (config.batch_size, length, m.num_heads, m.d_model // m.num_heads), jnp.float32, platform,
      dropout_rate=m.attention_dropout_rate)
  config_check.validate(config)
  model = type(model)(config_check.encoder_config(config, task))  # the same model, that attention
  state = jax.eval_shape(init)
  batch = {"tokens": jax.ShapeDtypeStruct((1, config.batch_size, task.max_length), jnp.int32),
           "labels": jax.ShapeDtypeStruct((1, config.batch_size), jnp.int32)}
  step = train.train_step_fn(config, model, tx, task.num_classes)
  text = _lower(step, state, batch, platform=platform).as_text()
  assert "dot_general" in text and len(text) > 10_000


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("shape, dtype, call", [
    ((4, 256, 8, 64), jnp.float32, {}),
    ((2, 2048, 8, 64), jnp.bfloat16, {"is_causal": True}),
    ((2, 1024, 8, 64), jnp.float32, {"dropout_rate": 0.1}),
])
def test_the_library_s_attention_lowers_as_the_automatic_choice_runs_it(platform, shape, dtype,
                                                                        call):
  implementation = _chosen(shape, dtype, platform, **call)
  if aj.attention.KERNELS[implementation].backend is not None:  # cudnn or a Pallas kernel
    pytest.skip(f"{implementation!r} lowers only with its runtime (checked elsewhere)")
  dropout = {"dropout_rng": jax.random.key(0)} if call.get("dropout_rate") else {}

  def loss(q, k, v):
    out = aj.dot_product_attention(q, k, v, implementation=implementation, **call, **dropout)
    return jnp.sum(out.astype(jnp.float32))

  q = jax.ShapeDtypeStruct(shape, dtype)
  assert _lower(jax.jit(jax.grad(loss, (0, 1, 2))), q, q, q, platform=platform).as_text()
