"""End-to-end training on a tiny config: steps, resume after SIGKILL, validation, many devices."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments import config_check, logbook, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Eight simulated CPU devices, also on a machine whose default backend is a GPU.
EIGHT_CPU_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
TINY = {
    "task_options.max_length": 12, "task_options.num_train": 512, "task_options.num_test": 64,
    "model.d_model": 16, "model.num_heads": 2, "model.num_layers": 1, "model.mlp_dim": 32,
    "model.dropout_rate": 0.1, "batch_size": 16, "num_train_steps": 8, "eval_every_steps": 4,
    "log_every_steps": 1, "checkpoint_every_steps": 2, "attention_maps": 0,
}


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


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def reference_run(data_dir, tmp_path_factory):
  """One uninterrupted tiny run, shared by the tests that compare against it."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  final = train.train_and_evaluate(tiny_config(data_dir, attention_maps=1), workdir)
  return workdir, final


def test_a_run_writes_config_metrics_checkpoints_and_maps(reference_run):
  workdir, final = reference_run
  lines = logbook.read(workdir)
  assert [line["step"] for line in lines if "loss" in line] == list(range(1, 9))
  evals = [line for line in lines if "eval_accuracy" in line]
  assert [line["step"] for line in evals] == [4, 8]
  assert evals[-1]["eval_accuracy"] == final["eval_accuracy"]
  assert 0.0 <= final["eval_accuracy"] <= 1.0 and np.isfinite(final["eval_loss"])
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["d_model"] == 16
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4", "6", "8"]
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  assert os.path.getsize(os.path.join(workdir, "attention_maps", "example_0.png")) > 1000


def test_same_seed_same_metrics_other_seed_different(reference_run, data_dir, tmp_path):
  workdir, _ = reference_run
  train.train_and_evaluate(tiny_config(data_dir), str(tmp_path / "same"))
  assert logbook.read(str(tmp_path / "same")) == logbook.read(workdir)
  train.train_and_evaluate(tiny_config(data_dir, seed=1), str(tmp_path / "other"))
  assert logbook.read(str(tmp_path / "other")) != logbook.read(workdir)


@pytest.mark.xfail(jax.default_backend() == "gpu", strict=False, reason=(
    "on an H100 the in-process run and the command's run differed from step 10 on (grad norm "
    "1.0772 vs 1.0762), and two runs of the command as subprocesses did not match either: "
    "XLA's per-process GPU autotuning or atomic scatter-adds are the suspects, and "
    "--xla_gpu_deterministic_ops the candidate fix, not yet tried on a GPU"))
def test_sigkill_then_same_command_ends_with_the_uninterrupted_metrics(data_dir, tmp_path):
  overrides = {"num_train_steps": 400, "eval_every_steps": 100, "log_every_steps": 10,
               "checkpoint_every_steps": 20}
  uninterrupted = str(tmp_path / "uninterrupted")
  train.train_and_evaluate(tiny_config(data_dir, **overrides), uninterrupted)

  workdir = str(tmp_path / "killed")
  process = subprocess.Popen(command(workdir, data_dir, **overrides), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  deadline = time.time() + 120
  while time.time() < deadline and process.poll() is None:
    if os.path.isdir(checkpoint_dir) and any(name.isdigit() for name in os.listdir(checkpoint_dir)):
      break
    time.sleep(0.02)
  assert process.poll() is None, "the run ended before it could be killed"
  process.send_signal(signal.SIGKILL)
  process.wait()
  killed_at = max(int(n) for n in os.listdir(checkpoint_dir) if n.isdigit())
  assert killed_at < 400

  subprocess.run(command(workdir, data_dir, **overrides), cwd=ROOT, check=True,
                 capture_output=True)
  assert logbook.read(workdir) == logbook.read(uninterrupted)


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_heads=3", "model.num_heads=3 must divide model.d_model=16"),
    ("--config.model.positional_encoding=relative", "model.positional_encoding must be one of"),
    ("--config.model.attention_scale=huge", "model.attention_scale must be a number or one of"),
    ("--config.learning_rate=0", "learning_rate must be positive"),
    ("--config.num_train_steps=-5", "num_train_steps must be positive"),
    ("--config.batch_size=12", "must be divisible by the 8 devices"),
    ("--config.model.num_layerz=2", "num_layerz"),
    ("--config.model.d_model=wide", "d_model"),
])
def test_bad_config_exits_nonzero_within_seconds_naming_the_field(override, message, tmp_path):
  env = {**os.environ, **EIGHT_CPU_DEVICES}
  started = time.time()
  result = subprocess.run(command(str(tmp_path), str(tmp_path)) + [override], cwd=ROOT, env=env,
                          capture_output=True, text=True)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert time.time() - started < 30
  assert not os.path.exists(tmp_path / "checkpoints")


@pytest.mark.parametrize("field, value, message", [
    ("task", "sorting", "task must be one of"),
    ("task_options.num_pairs", 4, "not an option of task 'order'"),
    ("model.pooling", "max", "model.pooling must be one of"),
    ("schedule", "linear", "schedule must be one of"),
    ("model.dropout_rate", 1.0, r"model.dropout_rate must be in \[0, 1\)"),
    ("num_train_steps", 2.5, "must be int"),
    ("model.attention_impl", *(("pallas_tpu", "runs only on tpu") if jax.default_backend() == "gpu"
                               else ("cudnn", "runs only on gpu"))),
])
def test_validation_in_process(field, value, message, data_dir):
  config = tiny_config(data_dir)
  if field.startswith("task_options."):
    config.task_options.unlock()
  with config.ignore_type():
    set_field(config, field, value)
  with pytest.raises(config_check.ConfigError, match=message):
    config_check.validate(config)


def test_eight_simulated_devices_follow_the_one_device_trajectory(reference_run, data_dir,
                                                                 tmp_path):
  workdir, _ = reference_run
  code = ("import sys; from experiments import train; from tests.test_train import tiny_config;"
          "import jax; assert jax.device_count() == 8;"
          "train.train_and_evaluate(tiny_config(sys.argv[1]), sys.argv[2])")
  env = {**os.environ, **EIGHT_CPU_DEVICES}
  subprocess.run([sys.executable, "-c", code, data_dir, str(tmp_path)], cwd=ROOT, env=env,
                 check=True, capture_output=True)
  one, eight = logbook.read(workdir), logbook.read(str(tmp_path))
  assert [line["step"] for line in one] == [line["step"] for line in eight]
  for a, b in zip(one, eight):
    for name in a:
      np.testing.assert_allclose(b[name], a[name], rtol=2e-4, atol=1e-6, err_msg=name)


def test_a_workdir_that_is_a_file_or_too_few_examples_is_a_config_error(data_dir, tmp_path):
  """Both end as one line from the command (config errors), and the file is left as it was."""
  path = tmp_path / "a_file"
  path.write_text("notes")
  with pytest.raises(config_check.ConfigError, match="is a file, not a directory"):
    train.train_and_evaluate(tiny_config(data_dir), str(path))
  assert path.read_text() == "notes"
  with pytest.raises(config_check.ConfigError,
                     match="batch_size=1024 exceeds the 512 training examples"):
    train.train_and_evaluate(tiny_config(data_dir, batch_size=1024), str(tmp_path / "run"))


def test_non_finite_loss_stops_with_step_and_advice(data_dir, tmp_path):
  config = tiny_config(data_dir, learning_rate=1e30, grad_clip_norm=0.0, schedule="constant",
                       num_train_steps=50)
  with pytest.raises(train.NonFiniteError, match=r"at step \d+; the last good checkpoint"):
    train.train_and_evaluate(config, str(tmp_path))


def test_train_step_is_traced_once_and_bfloat16_compute_trains(monkeypatch, data_dir, tmp_path):
  import chex
  chex.clear_trace_counter()
  monkeypatch.setattr(train, "train_step", chex.assert_max_traces(train.train_step, n=1))
  final = train.train_and_evaluate(tiny_config(data_dir, compute_dtype="bfloat16"),
                                   str(tmp_path))
  assert np.isfinite(final["eval_loss"])
  losses = [line["loss"] for line in logbook.read(str(tmp_path)) if "loss" in line]
  assert len(losses) == 8 and np.all(np.isfinite(losses))


def test_a_single_step_run_trains_evaluates_and_checkpoints(data_dir, tmp_path):
  final = train.train_and_evaluate(tiny_config(data_dir, num_train_steps=1), str(tmp_path))
  lines = logbook.read(str(tmp_path))
  assert [line["step"] for line in lines] == [1, 1]
  assert lines[1]["eval_accuracy"] == final["eval_accuracy"]
  assert os.listdir(tmp_path / "checkpoints") == ["1"]


def test_resuming_a_workdir_with_another_model_is_refused_and_loses_nothing(reference_run,
                                                                           data_dir):
  workdir, _ = reference_run
  before = open(os.path.join(workdir, "config.json")).read()
  with pytest.raises(config_check.ConfigError,
                     match=r"holds a run of a different config \(model.d_model changed\)"):
    train.train_and_evaluate(tiny_config(data_dir, **{"model.d_model": 32}), workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4", "6", "8"]
