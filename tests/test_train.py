"""End-to-end training on a tiny config: steps, metrics, validation, many devices."""

import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments import config_check, logbook, steps, train
from experiments import replicas as replicas_lib
from training_helpers import EIGHT_CPU_DEVICES, ROOT, command, set_field, tiny_config


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
  assert json.load(open(os.path.join(workdir, "replicas.json"))) == [{
      "name": "seed_0", "seed": 0, "learning_rate": 1e-3, "weight_decay": 0.01,
      "warmup_steps": 100.0}]
  replica = os.path.join(workdir, "replicas", "seed_0")
  assert os.listdir(os.path.join(replica, "tensorboard"))
  assert os.path.getsize(os.path.join(replica, "attention_maps", "example_0.png")) > 1000


def test_same_seed_same_metrics_other_seed_different(reference_run, data_dir, tmp_path):
  workdir, _ = reference_run
  train.train_and_evaluate(tiny_config(data_dir), str(tmp_path / "same"))
  assert logbook.read(str(tmp_path / "same")) == logbook.read(workdir)
  train.train_and_evaluate(tiny_config(data_dir, seed=1), str(tmp_path / "other"))
  assert logbook.read(str(tmp_path / "other")) != logbook.read(workdir)


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_heads=3", "model.num_heads=3 must divide d_model=16"),
    ("--config.model.positional_encoding=relative",
     "model.positional_encoding: unknown positional encoding 'relative'"),
    ("--config.model.attention_scale=huge", "model.attention_scale must be a number or one of"),
    ("--config.learning_rate=0", "learning_rate must be positive"),
    ("--config.num_train_steps=-5", "num_train_steps must be positive"),
    ("--config.batch_size=12", "must be divisible by the 8 devices"),
    ("--config.model.num_layerz=2", "num_layerz"),
    ("--config.mesh.sequence=3", "mesh.sequence=3 must divide the 8 devices"),
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


@pytest.mark.parametrize("module, arguments, line", [
    ("train", ["--config=configs/defaults.py"],
     "config error: no config file 'configs/defaults.py' (--config); configs/ holds default.py,"),
    ("sweep", ["--config=configs/ablations/heads.py:quik"],
     "config error: --config=configs/ablations/heads.py:quik: mode must be 'quick' (or none), "
     "got 'quik'."),
    ("train", ["--config=configs/default.py", "--config.model.num_head=3"],
     "config error: --config.model.num_head names a field the config does not have; did you "
     "mean model.num_heads?"),
    ("train", ["--config=configs/default.py", "--config.model.d_model=wide"],
     "config error: --config.model.d_model=wide: invalid literal for int()"),
])
def test_a_command_line_that_cannot_be_read_is_one_line_with_the_fix(module, arguments, line,
                                                                      tmp_path):
  result = subprocess.run([sys.executable, "-m", f"experiments.{module}",
                           f"--workdir={tmp_path}", *arguments], cwd=ROOT, capture_output=True,
                          text=True)
  assert result.returncode == 1
  assert result.stderr.strip().startswith(line) and "\n" not in result.stderr.strip(), \
      result.stderr[-2000:]


@pytest.mark.parametrize("field, value, message", [
    ("task", "sorting", "task must be one of"),
    ("task_options.num_pairs", 4, "not an option of task 'order'"),
    ("model.pooling", "max", "model.pooling must be one of"),
    ("schedule", "linear", "schedule must be one of"),
    ("model.dropout_rate", 1.0, r"model.dropout_rate must be in \[0, 1\)"),
    ("num_train_steps", 2.5, "must be int"),
    ("mesh.strategy", "ulysses", "mesh.strategy must be one of"),
    ("mesh.sequence", 0, "mesh.sequence must be >= 1"),
    ("mesh.data", -2, "mesh.data >= 0"),
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
  """Eight devices over the batch, then (mesh.sequence=4) two over the batch and four along the
  sequence, with context-parallel ring attention: the one-device run's metrics, step by step."""
  workdir, _ = reference_run
  code = ("import sys; from experiments import replicas, train;"
          "from tests.training_helpers import tiny_config;"
          "import jax; assert jax.device_count() == 8;"
          "train.train_and_evaluate(tiny_config(sys.argv[1]), sys.argv[2] + '/data');"
          "config = tiny_config(sys.argv[1], **{'mesh.sequence': 4});"
          "assert replicas.device_mesh(1, 0, 4).shape == {'replica': 1, 'data': 2, 'sequence': 4};"
          "train.train_and_evaluate(config, sys.argv[2] + '/sequence')")
  env = {**os.environ, **EIGHT_CPU_DEVICES}
  result = subprocess.run([sys.executable, "-c", code, data_dir, str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  one = logbook.read(workdir)
  for layout in ("data", "sequence"):
    eight = logbook.read(str(tmp_path / layout))
    assert [line["step"] for line in one] == [line["step"] for line in eight]
    for a, b in zip(one, eight):
      for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=2e-4, atol=1e-6,
                                   err_msg=f"{layout}: {name}")


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
  with pytest.raises(steps.NonFiniteError,
                     match=r"at step \d+ \(replicas \['seed_0'\]\); the last good checkpoint"):
    train.train_and_evaluate(config, str(tmp_path))


def test_train_step_is_traced_once_and_bfloat16_compute_trains(monkeypatch, data_dir, tmp_path):
  import chex
  chex.clear_trace_counter()
  monkeypatch.setattr(steps, "train_step", chex.assert_max_traces(steps.train_step, n=1))
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


@pytest.mark.parametrize("warmup, total", [(100, 600), (0, 50), (10, 10)])
def test_traced_schedules_match_optax_and_the_paper(warmup, total):
  import optax
  from experiments import optim
  steps_ = np.arange(total + 2, dtype=np.float32)
  expected = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=3e-3, warmup_steps=warmup, decay_steps=max(total, warmup + 1))
  np.testing.assert_allclose(optim.warmup_cosine(steps_, 3e-3, float(warmup), float(total)),
                             [expected(int(s)) for s in steps_], rtol=1e-5, atol=1e-9)
  w = max(warmup, 1)
  paper = [3e-3 * min(max(s, 1) / w, (w / max(s, 1)) ** 0.5) for s in steps_]  # eq. 3, rescaled
  np.testing.assert_allclose(optim.noam(steps_, 3e-3, float(warmup), float(total)), paper,
                             rtol=1e-5)


def test_a_token_level_task_trains_and_scores_only_its_targets(data_dir, tmp_path):
  """mqar: logits at every position, loss and accuracy over the query positions only (checked
  against the trained model's predictions read off by hand); attention maps and the logged
  maximum attention logit work for the token-level head too."""
  from experiments import trained
  config = tiny_config(data_dir, task="mqar", attention_maps=1, num_train_steps=4)
  config.task_options = {"num_pairs": 4, "num_queries": 3, "num_keys": 8, "num_values": 6,
                         "length": 12, "num_train": 512, "num_test": 40}
  final = train.train_and_evaluate(config, str(tmp_path))
  run = trained.load(str(tmp_path))
  assert run.task.token_level
  logits = run.model.apply({"params": run.params}, run.task.test.tokens)  # [40, 12, 6]
  targets = run.task.test.labels
  scored = targets >= 0
  assert scored.sum() == 40 * 3
  expected = np.mean(np.argmax(np.asarray(logits), -1)[scored] == targets[scored])
  np.testing.assert_allclose(final["eval_accuracy"], expected, atol=1e-6)
  lines = logbook.read(str(tmp_path))
  assert all(np.isfinite(line["max_attention_logit"]) for line in lines if "loss" in line)
  assert os.path.exists(tmp_path / "replicas" / "seed_0" / "attention_maps" / "example_0.png")


def test_a_diverging_replica_is_frozen_and_the_others_train_on(data_dir, tmp_path):
  """A grid with one learning rate that diverges: that replica is marked with its step and NaN
  evaluations; the other one trains exactly as it would alone."""
  config = tiny_config(data_dir, grad_clip_norm=0.0, schedule="constant")
  replicas = replicas_lib.replicas_of(config, 1, {"learning_rate": (1e-3, 1e30)})
  result = train.train(config, str(tmp_path / "grid"), replicas)
  assert result["diverged_at"][0] == 0 and result["diverged_at"][1] > 0
  assert np.isnan(result["eval_accuracy"][1]) and np.isnan(result["eval_loss"][1])
  alone = train.train_and_evaluate(config, str(tmp_path / "alone"))
  np.testing.assert_allclose(result["eval_loss"][0], alone["eval_loss"], rtol=1e-5)
  assert result["eval_accuracy"][0] == alone["eval_accuracy"]


def test_a_finished_run_says_where_its_outputs_are_and_a_rerun_says_it_is_finished(
    reference_run, data_dir, tmp_path, capsys):
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference_run[0], workdir)
  final = train.train_and_evaluate(tiny_config(data_dir, attention_maps=1), workdir)
  out = capsys.readouterr().out
  assert f"{workdir} already finished its 8 steps" in out
  assert f"outputs in {workdir}: config.json" in out
  assert f"tensorboard --logdir={workdir}" in out.splitlines()[-1]
  assert final == reference_run[1]
