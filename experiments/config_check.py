"""Validation of a run's config before anything is compiled: one line naming field and fix."""

from __future__ import annotations

import functools
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


class ConfigError(ValueError):
  """A config value that cannot run; the message names the field and what would be valid."""


class ConfigWarning(UserWarning):
  """A config value that runs but does not do what its name promises; the message names the fix."""


@functools.cache
def _default_module():
  """configs/default.py, read once per process."""
  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "default.py")
  spec = importlib.util.spec_from_file_location("default_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def default_config():
  """A fresh copy of configs/default.py's config (the caller may change it)."""
  return _default_module().get_config()


def _check_fields(config, reference, prefix=""):
  """Unknown fields and wrong types, against configs/default.py (task_options excepted)."""
  for name in config.keys():
    field = prefix + name
    if name not in reference:
      raise ConfigError(f"unknown config field '{field}'; valid fields here: "
                        f"{sorted(reference.keys())}.")
    value, expected = config[name], reference[name]
    if field in ("task_options", "model.head_variant_options"):
      continue  # the task's or the variant's own options, checked by them
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
  if config.model.get("causal", False) and config.model.pooling == "cls":
    raise ConfigError("model.causal=True with model.pooling='cls': under the causal mask the CLS "
                      "token (position 0) sees only itself; set model.pooling='last' (or "
                      "'mean').")
  if tasks.is_regression(config.task) and config.label_smoothing:
    raise ConfigError(f"label_smoothing={config.label_smoothing} smooths class labels, but task "
                      f"{config.task!r} has real-valued targets (mean squared error); set "
                      "label_smoothing=0.")
  model = config.model
  attention_scale(model.attention_scale)
  encoder_config(config, warn=True)  # the model's own checks, as one-line config errors
  choices = {"schedule": (config.schedule, optim.SCHEDULES),
             "optimizer": (config.optimizer, optim.OPTIMIZERS),
             "compute_dtype": (config.compute_dtype, COMPUTE_DTYPES)}
  for field, (value, valid) in choices.items():
    if value not in valid:
      raise ConfigError(f"{field} must be one of {list(valid)}, got {value!r}.")
  required = aj.attention.KERNELS[model.attention_impl].backend if model.attention_impl else None
  if required is not None and required != jax.default_backend():
    raise ConfigError(f"model.attention_impl={model.attention_impl!r} runs only on {required}, "
                      f"and this machine's backend is {jax.default_backend()}; use '' "
                      "(automatic) to let each machine pick its kernel.")
  for field in ("learning_rate", "num_train_steps", "batch_size", "eval_every_steps",
                "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    if config[field] <= 0:
      raise ConfigError(f"{field} must be positive, got {config[field]}.")
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
  if not 0.0 <= config.momentum < 1.0 or config.query_lr_scale <= 0:
    raise ConfigError(f"momentum must be in [0, 1) and query_lr_scale positive, got "
                      f"{config.momentum} and {config.query_lr_scale}.")
  if not 0.0 <= config.label_smoothing < 1.0:
    raise ConfigError(f"label_smoothing must be in [0, 1), got {config.label_smoothing}.")
  if config.mesh.sequence < 1 or config.mesh.data < 0:
    raise ConfigError(f"mesh.sequence must be >= 1 and mesh.data >= 0 (0: every device left), "
                      f"got sequence={config.mesh.sequence}, data={config.mesh.data}.")
  _check_context_parallel(config)


def _check_context_parallel(config) -> None:
  """mesh.strategy, and with mesh.sequence > 1 what the run asks of context-parallel attention
  (the implementation, attention dropout, ALiBi's bias, a head variant's own attention or
  arguments), refused by the library's own check (``context_parallel.check_request``)."""
  model, mesh = config.model, config.mesh
  try:
    aj.context_parallel.check_request(strategy=mesh.strategy)
  except ValueError as error:
    raise ConfigError(f"mesh.{error}") from None
  if mesh.sequence == 1:
    return
  variant = encoder_config(config).head_variant_of(0)
  custom = sorted(set(variant.attention_arguments(None)) & {"sinks", "normalizer"})
  try:
    aj.context_parallel.check_request(
        strategy=mesh.strategy, implementation=model.attention_impl or None,
        per_row=model.positional_encoding == "alibi",  # a bias [N, T, S]
        dropout_rate=model.attention_dropout_rate,
        custom=["hooks"] * variant.forms_maps + custom)
  except ValueError as error:
    raise ConfigError(f"mesh.sequence={mesh.sequence} runs attention context-parallel "
                      f"(model.head_variant={model.head_variant!r}, model.attention_impl="
                      f"{model.attention_impl!r}, model.positional_encoding="
                      f"{model.positional_encoding!r}, model.attention_dropout_rate="
                      f"{model.attention_dropout_rate}): {error} Or set mesh.sequence=1."
                      ) from None


def encoder_config(config, task: tasks.Task | None = None, mesh=None, *,
                   warn: bool = False) -> aj.EncoderConfig:
  """The model of ``config`` as the library's ``EncoderConfig``, whose own checks are the
  model's validation: a ValueError it raises becomes a one-line ConfigError naming the config
  field. ``task`` gives the vocabulary, classes and input features (without one, while
  validating, the task's own stand in: any task has valid ones); with a "sequence" axis of
  ``mesh`` longer than 1, attention runs context-parallel over it."""
  model = config.model
  options = dict(model.get("head_variant_options", {}))  # absent from older runs' configs
  unset = default_config().model  # a deprecated key at its default is not set
  for old, name in aj.encoder.DEPRECATED_OPTIONS.items():
    if model.get(old, unset[old]) != unset[old]:
      if warn:
        warnings.warn(f"model.{old} is deprecated; set model.head_variant_options.{name}="
                      f"{model[old]!r} instead.", ConfigWarning, stacklevel=3)
      options.setdefault(name, model[old])
  from_task = {} if task is None else dict(
      vocab_size=task.vocab_size, input_features=task.input_features, pad_id=task.pad_id,
      num_classes=task.num_classes)
  sharded = mesh is not None and mesh.shape.get("sequence", 1) > 1
  try:
    return aj.EncoderConfig(**{"vocab_size": 1, **from_task},
        d_model=model.d_model, num_heads=model.num_heads, num_layers=model.num_layers,
        mlp_dim=model.mlp_dim,
        max_length=max(model.max_length, 1 if task is None else task.max_length),
        positional_encoding=model.positional_encoding,
        attention_scale=attention_scale(model.attention_scale), head_dim=model.head_dim,
        normalize_qk=model.normalize_qk, query_init_scale=model.query_init_scale,
        dropout_rate=model.dropout_rate, attention_dropout_rate=model.attention_dropout_rate,
        pre_layer_norm=model.pre_layer_norm, causal=model.get("causal", False),
        attention_impl=model.attention_impl or None,
        pooling=model.pooling, head_variant=model.head_variant, head_variant_options=options,
        attention_fn=aj.ContextParallel(mesh, "sequence", config.mesh.strategy)
        if sharded else None)
  except ValueError as error:
    message = str(error)
    field = re.match(r"[a-z_]+", message)
    in_config = field is not None and field.group() in model
    raise ConfigError(("model." if in_config else "model: ") + message) from None


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
  """absl's app.run(run), with every failure to read the command line in one line naming the
  fix: a config file that is not there, a config's own error (a misspelt mode), an --config
  override of a field the config does not have (with its dotted path) or of the wrong type, and
  absl's own flag errors (a missing --workdir), a sweep config given to experiments.train or a
  training config to experiments.sweep."""
  from absl import app, flags

  def parse(argv):
    try:
      arguments = flags.FLAGS(argv)
      config = flags.FLAGS["config"].value
      if config is not None:
        config.get("any")  # a config file that failed to load raises on first use
    except Exception as error:  # noqa: BLE001 -- each becomes one line below
      sys.exit(command_line_error(error, argv))
    mismatch = config_kind_error(config, argv)
    if mismatch:
      sys.exit(mismatch)
    return arguments

  app.run(run, flags_parser=parse)


def command_line_error(error: Exception, argv) -> str:
  """The one line for a command line that could not be read (``run_app``).

  >>> command_line_error(AttributeError('num_head Did you mean "num_heads"?'),
  ...                    ["train", "--config=configs/default.py", "--config.model.num_head=3"])
  'config error: --config.model.num_head names a field the config does not have; did you
  mean model.num_heads?'
  """
  message = str(error)
  if isinstance(error, OSError) or "No such file or directory" in message:
    path = _flag_value(argv, "config").split(":", 1)[0]
    folder = os.path.dirname(path) if os.path.isdir(os.path.dirname(path) or ".") else "configs"
    configs = sorted(name for name in os.listdir(folder) if name.endswith(".py")
                     and name != "__init__.py") if os.path.isdir(folder) else []
    where = (f"; {folder}/ holds {', '.join(configs)}" if configs else
             "; run from the repository's root (the folder holding configs/)")
    return f"config error: no config file {path!r} (--config){where}."
  if isinstance(error, (AttributeError, KeyError)):  # an override of a field that is not there
    detail = " ".join(message.encode().decode("unicode_escape").replace("'", "")
                      .replace('"', " ", 2).split())
    field, _, hint = detail.partition(" ")
    overrides = [arg.split("=", 1)[0][len("--config."):] for arg in argv
                 if arg.startswith("--config.")]
    path = next((o for o in overrides if o.split(".")[-1] == field),
                next((o for o in overrides if field in o.split(".")), field))
    if _program(argv) == "experiments.sweep" and path.split(".")[0] in default_config():
      return (f"config error: --config.{path} names a field the sweep config does not have; a "
              f"sweep's training fields are under train: did you mean "
              f"train.{_closest_training_field(path)}?")
    guess = re.search(r'Did you mean "?([\w.]+)"?', hint)
    prefix = path.rpartition(".")[0]
    suggestion = (f"; did you mean {prefix + '.' if prefix else ''}{guess.group(1)}?" if guess
                  else ".")
    return f"config error: --config.{path} names a field the config does not have{suggestion}"
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  first = lines[0] if lines else type(error).__name__
  if "Error whilst parsing config file" in message:  # the config's own error, e.g. its mode
    flag = first.split(": Error whilst", 1)[0].removeprefix("flag ")
    reason = lines[-1].split(": ", 1)[-1]
    if "get_config() takes 0 positional arguments" in reason:  # a mode given to a plain config
      path, _, mode = flag.removeprefix("--config=").partition(":")
      return f"config error: {flag}: {path} takes no mode; drop ':{mode}'."
    return f"config error: {flag}: {reason}"
  first = first.removeprefix("flag ").removesuffix(".")
  if first.startswith("--config"):
    return f"config error: {first}."
  return f"command line error: {first}; python -m {_program(argv)} --helpshort lists the flags."


def config_kind_error(config, argv) -> str | None:
  """The one line when ``config`` is of the other command's kind (a sweep config, with its
  ``train`` and ``num_seeds``, given to experiments.train, or a training config to
  experiments.sweep); None when it fits.

  >>> config_kind_error({"train": {}, "num_seeds": 3},
  ...                   ["train.py", "--config=configs/ablations/heads.py:quick"])
  'config error: --config=configs/ablations/heads.py:quick is a sweep config; run it with python
  -m experiments.sweep --config=configs/ablations/heads.py:quick --workdir=...'
  >>> config_kind_error({"model": {}}, ["sweep.py", "--config=configs/mqar.py"])
  'config error: --config=configs/mqar.py is a training config; run it with python -m
  experiments.train, or give experiments.sweep a sweep config from configs/ablations/.'
  """
  if config is None:
    return None
  program, path = _program(argv), _flag_value(argv, "config")
  is_sweep = "train" in config and "num_seeds" in config
  if program == "experiments.train" and is_sweep:
    return (f"config error: --config={path} is a sweep config; run it with python -m "
            f"experiments.sweep --config={path} --workdir=...")
  if program == "experiments.sweep" and not is_sweep:
    return (f"config error: --config={path} is a training config; run it with python -m "
            f"experiments.train, or give experiments.sweep a sweep config from configs/ablations/.")
  return None


def _closest_training_field(path: str) -> str:
  """``path`` with each unknown name replaced by the nearest field of configs/default.py.

  >>> _closest_training_field("model.num_headz")
  'model.num_heads'
  """
  import difflib
  fields, names = default_config(), []
  for name in path.split("."):
    if hasattr(fields, "keys") and name not in fields:
      name = (difflib.get_close_matches(name, list(fields.keys()), n=1) or [name])[0]
    names.append(name)
    fields = fields[name] if hasattr(fields, "keys") and name in fields else None
  return ".".join(names)


def _flag_value(argv, name: str) -> str:
  """The value of --name=VALUE or --name VALUE in ``argv`` ("" when absent)."""
  for index, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and index + 1 < len(argv):
      return argv[index + 1]
  return ""


def _program(argv) -> str:
  """The module a command line ran (experiments.train or experiments.sweep)."""
  program = os.path.splitext(os.path.basename(argv[0]))[0] if argv else "train"
  return f"experiments.{program}"
