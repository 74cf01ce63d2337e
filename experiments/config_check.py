"""Validation of a run's config before anything is compiled: one line naming field and fix."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import warnings

import jax
import jax.numpy as jnp

import attention_jax as aj
from experiments import optim
from experiments import oracles
from experiments import tasks

COMPUTE_DTYPES = ("float32", "bfloat16")
INITS = ("random", "oracle")  # config.init
IMPLEMENTATIONS = ("",) + aj.IMPLEMENTATIONS


class ConfigError(ValueError):
  """A config value that cannot run; the message names the field and what would be valid."""


class ConfigWarning(UserWarning):
  """A config value that runs but does not do what its name promises; the message names the fix."""


def default_config():
  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "default.py")
  spec = importlib.util.spec_from_file_location("default_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _check_fields(config, reference, prefix=""):
  """Unknown fields and wrong types, against configs/default.py (task_options excepted)."""
  for name in config.keys():
    field = prefix + name
    if name not in reference:
      raise ConfigError(f"unknown config field '{field}'; valid fields here: "
                        f"{sorted(reference.keys())}.")
    value, expected = config[name], reference[name]
    if field == "task_options":
      continue
    if hasattr(expected, "keys"):
      if not hasattr(value, "keys"):
        raise ConfigError(f"config field '{field}' must be a group of fields, got {value!r}.")
      _check_fields(value, expected, field + ".")
    elif field == "model.attention_scale":
      continue  # a name or a number, checked below
    elif isinstance(expected, float) and isinstance(value, int) and not isinstance(value, bool):
      continue
    elif type(value) is not type(expected):
      raise ConfigError(f"config field '{field}' must be {type(expected).__name__}, "
                        f"got {value!r} ({type(value).__name__}).")


def attention_scale(value):
  """A scale name, or a number given as a number or a numeric string."""
  if isinstance(value, str) and value not in aj.SCALES:
    try:
      return float(value)
    except ValueError:
      raise ConfigError(f"model.attention_scale must be a number or one of "
                        f"{sorted(aj.SCALES)}, got {value!r}.") from None
  return value


def validate(config) -> None:
  """Raises ConfigError for the first problem found (the batch's split over the devices is
  checked with the mesh, by check_batch_split)."""
  _check_fields(config, default_config())
  if config.task not in tasks.TASKS:
    raise ConfigError(f"task must be one of {sorted(tasks.TASKS)}, got {config.task!r}.")
  known = tasks.task_options(config.task)
  for name, value in config.task_options.items():
    if name not in known:
      raise ConfigError(f"task_options.{name} is not an option of task {config.task!r}; "
                        f"its options: {sorted(known)}.")
    if not isinstance(value, int) or value <= 0:
      raise ConfigError(f"task_options.{name} must be a positive integer, got {value!r}.")
  if tasks.is_regression(config.task) and config.label_smoothing:
    raise ConfigError(f"label_smoothing={config.label_smoothing} smooths class labels, but task "
                      f"{config.task!r} has real-valued targets (mean squared error); set "
                      "label_smoothing=0.")
  model = config.model
  if model.head_dim < 0:
    raise ConfigError(f"model.head_dim must be >= 0 (0: d_model / num_heads), got "
                      f"{model.head_dim}.")
  if model.num_heads <= 0 or (not model.head_dim and model.d_model % model.num_heads):
    raise ConfigError(f"model.num_heads={model.num_heads} must divide model.d_model="
                      f"{model.d_model}; choose a divisor of {model.d_model}, or set "
                      "model.head_dim.")
  if model.positional_encoding not in aj.POSITIONAL_ENCODINGS:
    raise ConfigError(f"model.positional_encoding must be one of "
                      f"{sorted(aj.POSITIONAL_ENCODINGS)}, got {model.positional_encoding!r}.")
  key_dim = model.head_dim or model.d_model // model.num_heads
  if model.positional_encoding == "rope" and key_dim % 2:
    raise ConfigError(f"model.positional_encoding='rope' rotates pairs of dimensions, so d_k must "
                      f"be even, got d_k={key_dim}; use fewer heads, an even model.head_dim, or "
                      "another encoding.")
  attention_scale(model.attention_scale)
  choices = {"model.attention_impl": (model.attention_impl, IMPLEMENTATIONS),
             "model.pooling": (model.pooling, aj.encoder.POOLINGS),
             "model.overlap_schedule": (model.overlap_schedule,
                                        tuple(aj.variants.overlap.SCHEDULES)),
             "schedule": (config.schedule, optim.SCHEDULES),
             "compute_dtype": (config.compute_dtype, COMPUTE_DTYPES)}
  for field, (value, valid) in choices.items():
    if value not in valid:
      raise ConfigError(f"{field} must be one of {list(valid)}, got {value!r}.")
  _check_head_variant(config, key_dim)
  required = aj.attention.KERNELS[model.attention_impl].backend if model.attention_impl else None
  if required is not None and required != jax.default_backend():
    raise ConfigError(f"model.attention_impl={model.attention_impl!r} runs only on {required}, "
                      f"and this machine's backend is {jax.default_backend()}; use '' "
                      "(automatic) to let each machine pick its kernel.")
  for field in ("learning_rate", "num_train_steps", "batch_size", "eval_every_steps",
                "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
                "model.d_model", "model.num_layers", "model.mlp_dim"):
    value = config[field.split(".")[0]] if "." not in field else model[field.split(".")[1]]
    if value <= 0:
      raise ConfigError(f"{field} must be positive, got {value}.")
  if config.init not in INITS:
    raise ConfigError(f"init must be one of {list(INITS)}, got {config.init!r}.")
  if config.init == "oracle" and config.task not in oracles.ORACLES:
    raise ConfigError(f"init='oracle' needs a task with a hand-set solution "
                      f"({sorted(oracles.ORACLES)}), got task {config.task!r}.")
  for field, value in (("warmup_steps", config.warmup_steps),
                       ("init_noise", config.init_noise), ("init_beta", config.init_beta),
                       ("model.max_length", model.max_length),
                       ("weight_decay", config.weight_decay),
                       ("grad_clip_norm", config.grad_clip_norm),
                       ("attention_maps", config.attention_maps)):
    if value < 0:
      raise ConfigError(f"{field} must be >= 0, got {value}.")
  if config.schedule != "constant" and config.warmup_steps >= config.num_train_steps:
    warnings.warn(f"warmup_steps={config.warmup_steps} is not shorter than num_train_steps="
                  f"{config.num_train_steps}: the learning rate never reaches its peak and never "
                  f"decays; set e.g. --config.warmup_steps={config.num_train_steps // 10}.",
                  ConfigWarning, stacklevel=2)
  for field, value in (("model.dropout_rate", model.dropout_rate),
                       ("model.attention_dropout_rate", model.attention_dropout_rate),
                       ("label_smoothing", config.label_smoothing)):
    if not 0.0 <= value < 1.0:
      raise ConfigError(f"{field} must be in [0, 1), got {value}.")
  if config.mesh.sequence < 1 or config.mesh.data < 0:
    raise ConfigError(f"mesh.sequence must be >= 1 and mesh.data >= 0 (0: every device left), "
                      f"got sequence={config.mesh.sequence}, data={config.mesh.data}.")
  if config.mesh.strategy not in aj.context_parallel.STRATEGIES:
    raise ConfigError(f"mesh.strategy must be one of {list(aj.context_parallel.STRATEGIES)}, got "
                      f"{config.mesh.strategy!r}.")
  if config.mesh.sequence > 1:
    if model.attention_dropout_rate:
      raise ConfigError("mesh.sequence > 1 (context-parallel attention) has no attention dropout; "
                        "set model.attention_dropout_rate=0.")
    if model.positional_encoding == "alibi" and config.mesh.strategy == "ring":
      raise ConfigError("ALiBi's bias needs mesh.strategy='all_gather' when mesh.sequence > 1.")


def _check_head_variant(config, key_dim: int) -> None:
  """The variant's own check (head counts and widths it can use), and what it asks of the
  experiment: a variant that forms every head's maps runs on the reference path only."""
  model = config.model
  try:
    variant = aj.variants.variant_class(model.head_variant)
  except ValueError as error:
    raise ConfigError(f"model.head_variant: {error}") from None
  if variant.forms_maps:
    if model.attention_impl not in ("", "reference"):
      raise ConfigError(f"model.head_variant={model.head_variant!r} forms every head's logits at "
                        f"each (query, key) pair, which {model.attention_impl!r} never forms; use "
                        "model.attention_impl='' or 'reference'.")
    if config.mesh.sequence > 1:
      raise ConfigError(f"model.head_variant={model.head_variant!r} runs its own attention, not "
                        "context-parallel; set mesh.sequence=1.")
  try:
    layer = aj.variants.layer_variant(
        model.head_variant, layer=0, num_layers=model.num_layers,
        shared_heads=model.moh_shared_heads, routed_heads=model.moh_routed_heads,
        overlap_schedule=model.overlap_schedule)
    layer.check(num_heads=model.num_heads, head_dim=key_dim)
  except ValueError as error:
    raise ConfigError(f"model.head_variant={model.head_variant!r} with model.moh_shared_heads / "
                      f"model.moh_routed_heads / model.overlap_schedule: {error}") from None
  custom = sorted(set(layer.attention_arguments(None)) & {"sinks", "normalizer"})
  if custom and config.mesh.sequence > 1:
    raise ConfigError(f"model.head_variant={model.head_variant!r} sets {', '.join(custom)}, which "
                      "context-parallel attention does not serve; set mesh.sequence=1.")


#: XLA's flags for reproducible GPU steps. On an H200 (jax 0.11.2) either one made a bfloat16
#: training step with cuDNN attention fail to compile ("IndexError: absl::container_internal::
#: raw_hash_map<>::at"), and gave equal runs in float32 (docs/performance.md, "On an NVIDIA H200").
GPU_DETERMINISM_FLAGS = ("xla_gpu_deterministic_ops", "xla_gpu_exclude_nondeterministic_ops")


def check_gpu_determinism_flags(config, xla_flags: str | None = None,
                                device: jax.Device | None = None) -> None:
  """Refuses, before compiling, a run whose XLA_FLAGS set a determinism flag that would crash
  XLA in its step: on a GPU with cuDNN attention, named or as ``select_implementation`` would
  choose it for the model's heads in ``compute_dtype`` on ``device``."""
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  device = jax.devices()[0] if device is None else device
  named = [flag for flag in GPU_DETERMINISM_FLAGS
           if re.search(rf"--{flag}(=(true|1))?(\s|$)", flags, re.IGNORECASE)]
  if device.platform != "gpu" or not named:
    return
  model, implementation = config.model, config.model.attention_impl
  if implementation:
    cudnn = implementation == "cudnn"
  else:  # one head of the model's attention, at a length that every kernel takes
    head = jax.ShapeDtypeStruct((1, 128, model.num_heads, model.head_dim or model.d_model
                                 // model.num_heads), jnp.dtype(config.compute_dtype))
    cudnn = aj.select_implementation(
        head, head, head, backend="gpu", device_kind=device.device_kind,
        compute_capability=getattr(device, "compute_capability", None)) == "cudnn"
  if cudnn:
    raise ConfigError(
        f"XLA_FLAGS sets --{named[0]}, which makes XLA fail to compile a step with cuDNN "
        f"attention (compute_dtype={config.compute_dtype!r}, model.attention_impl="
        f"{implementation!r}); train in float32 for a bitwise-reproducible run, or unset it.")


def check_batch_split(batch_size: int, num_devices: int) -> None:
  """The global batch must split evenly over the ``num_devices`` of the mesh's data axis."""
  if batch_size % num_devices:
    raise ConfigError(f"batch_size={batch_size} must be divisible by the "
                      f"{num_devices} devices; use a multiple of {num_devices}.")


def run_app(run) -> None:
  """absl's app.run(run), with a one-line error when a --config override names a field the
  config does not have (config_flags raises AttributeError or KeyError while parsing flags)."""
  from absl import app
  started = []

  def tracked(argv):
    started.append(True)
    run(argv)

  try:
    app.run(tracked)
  except (AttributeError, KeyError) as error:
    if started:  # a bug past flag parsing, not a config problem
      raise
    detail = " ".join(str(error).encode().decode("unicode_escape").replace("'", "").split())
    sys.exit(f"config error: an --config override names a field the config does not have: "
             f"{detail}")
