"""Shared by the training, sweep, workdir and probe tests: a tiny config and the command that
runs it; runs at a task's hand-set solution."""

import os
import sys
import types

import jax

from configs.ablations import heads_length
from experiments import config_check, sweep, train
from experiments import replicas as replicas_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Eight simulated CPU devices, also on a machine whose default backend is a GPU.
EIGHT_CPU_DEVICES = {  # for a subprocess's environment (keeping the flags conftest.py set)
    "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
    "JAX_PLATFORMS": "cpu"}


def on_eight_devices(program: str):
  """The JSON ``program`` (Python source) prints last, run in a fresh Python on eight simulated
  CPU devices; a failure of the program fails the test with its stderr."""
  import json
  import subprocess
  result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **EIGHT_CPU_DEVICES})
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


TINY = {
    "task_options.max_length": 12, "task_options.num_train": 512, "task_options.num_test": 64,
    "model.d_model": 16, "model.num_heads": 2, "model.num_layers": 1, "model.mlp_dim": 32,
    "model.dropout_rate": 0.1, "batch_size": 16, "num_train_steps": 8, "eval_every_steps": 4,
    "log_every_steps": 1, "checkpoint_every_steps": 2, "attention_maps": 0,
}
GRID = {"learning_rate": (1e-3, 3e-3)}  # a hyperparameter grid for the replica tests


def set_field(config, field, value):
  """config["a.b"] = value for a dotted field name; returns the group that holds the field."""
  *parents, name = field.split(".")
  for parent in parents:
    config = config[parent]
  config[name] = value
  return config


def tiny_config(data_dir, **overrides):
  config = config_check.default_config()
  for field, value in {**TINY, "data_dir": data_dir, **overrides}.items():
    set_field(config, field, value)
  return config


def command(workdir, data_dir, **overrides):
  flags = [f"--config.{k}={v}" for k, v in {**TINY, "data_dir": data_dir, **overrides}.items()]
  return [sys.executable, "-m", "experiments.train", "--config=configs/default.py",
          f"--workdir={workdir}"] + flags


def oracle_run(config, solution, *options):
  """(solved, untrained): Trained-like runs of ``config`` (config, task, model, params) at its
  task's hand-set solution, ``solution(model, params, *options)``, and at random init."""
  task, model, _, _ = train.setup(config, replicas_lib.replicas_of(config))
  params = model.init(jax.random.key(0), task.test.tokens[:1])["params"]
  run = dict(config=config, task=task, model=model)
  return (types.SimpleNamespace(**run, params=solution(model, params, *options)),
          types.SimpleNamespace(**run, params=params))


def four_maxima_config(data_dir):
  """heads_length's quick h4_T8 arm (four heads, four maxima, T = 8), 256 test examples."""
  config = sweep.variant_config(heads_length.get_config("quick"),
                                dict(heads_length.get_config().variants)["h4_T8"])
  config.data_dir = data_dir
  config.task_options.update(num_train=1, num_test=256)
  return config
