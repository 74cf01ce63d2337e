"""What happens to real runs: SIGTERM and SIGKILL, a damaged checkpoint, two processes, a full disk."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import pytest

from experiments import checkpoints, logbook, train, workdir as workdir_lib
from training_helpers import ROOT, command, tiny_config

LONG = {"num_train_steps": 400, "eval_every_steps": 100, "log_every_steps": 10,
        "checkpoint_every_steps": 20}


def checkpoint_steps(workdir):
  directory = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def start_and_signal(workdir, data_dir, signum, after_step):
  """Starts the training command and sends ``signum`` once checkpoint ``after_step`` or a later
  one exists; returns the finished process (stderr as text)."""
  process = subprocess.Popen(command(workdir, data_dir, **LONG), cwd=ROOT, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 120
  while time.time() < deadline and process.poll() is None:
    if os.path.isdir(os.path.join(workdir, "checkpoints")) and any(
        step >= after_step for step in checkpoint_steps(workdir)):
      break
    time.sleep(0.02)
  assert process.poll() is None, "the run ended before it could be stopped"
  process.send_signal(signum)
  process.wait()
  process.stderr_text = process.stderr.read()
  return process


@pytest.mark.xfail(jax.default_backend() == "gpu" and "nondeterministic_ops" not in os.environ.get(
    "XLA_FLAGS", ""), strict=False, reason=(
    "XLA:GPU adds the embedding's gradient (a scatter) with atomics and autotunes per process: "
    "on an H200 two runs differed (scripts/determinism_check.py); this test passed there with "
    "--xla_gpu_deterministic_ops (XLA_FLAGS=--xla_gpu_exclude_nondeterministic_ops=true also "
    "gave equal runs), but both flags crash XLA 0.11.2 beside cuDNN attention, so the trainer "
    "does not set them (docs/performance.md)"))
def test_sigterm_then_sigkill_then_the_same_command_ends_with_the_uninterrupted_metrics(
    data_dir, tmp_path):
  uninterrupted = str(tmp_path / "uninterrupted")
  train.train_and_evaluate(tiny_config(data_dir, **LONG), uninterrupted)
  workdir = str(tmp_path / "run")

  stopped = start_and_signal(workdir, data_dir, signal.SIGTERM, after_step=20)
  assert stopped.returncode == 128 + signal.SIGTERM
  line = stopped.stderr_text.strip().splitlines()[-1]
  step = max(checkpoint_steps(workdir))
  assert line.startswith(f"stopped by SIGTERM at step {step}: checkpoint saved; resume with: ")
  assert "experiments.train" in line and f"--workdir={workdir}" in line
  assert "Traceback" not in stopped.stderr_text and step < 400

  killed = start_and_signal(workdir, data_dir, signal.SIGKILL, after_step=step + 20)
  assert killed.returncode == -signal.SIGKILL and max(checkpoint_steps(workdir)) < 400

  subprocess.run(command(workdir, data_dir, **LONG), cwd=ROOT, check=True, capture_output=True)
  assert logbook.read(workdir) == logbook.read(uninterrupted)


def test_an_unreadable_latest_checkpoint_is_set_aside_and_the_run_completes(
    reference_run, data_dir, tmp_path, capfd):
  reference, final = reference_run
  workdir = str(tmp_path / "damaged")
  shutil.copytree(reference, workdir)
  for folder, _, files in os.walk(os.path.join(workdir, "checkpoints", "8")):
    for name in files:
      with open(os.path.join(folder, name), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(folder, name)) // 2)
  capfd.readouterr()

  assert train.train_and_evaluate(tiny_config(data_dir, attention_maps=1), workdir) == final
  warning = [line for line in capfd.readouterr().err.splitlines() if "unreadable" in line]
  assert len(warning) == 1 and "checkpoint 8" in warning[0], warning
  assert "resuming from step 6" in warning[0]
  assert os.path.isdir(os.path.join(workdir, "checkpoints_unreadable", "8"))
  assert checkpoint_steps(workdir) == [4, 6, 8]
  assert logbook.read(workdir) == logbook.read(reference)


def test_a_second_process_is_refused_and_a_killed_holder_does_not_block(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  with workdir_lib.owned(workdir):
    result = subprocess.run(command(workdir, data_dir), cwd=ROOT, capture_output=True, text=True)
    with pytest.raises(workdir_lib.WorkdirError, match=f"in use by process {os.getpid()} "):
      train.train_and_evaluate(tiny_config(data_dir), workdir)
  assert result.returncode == 1
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"workdir error: {workdir} is in use by process {os.getpid()} on ")
  assert "Traceback" not in result.stderr and not os.path.exists(os.path.join(workdir,
                                                                               "checkpoints"))
  holder = ("import os, signal, sys; from experiments import workdir\n"
            "with workdir.owned(sys.argv[1]): os.kill(os.getpid(), signal.SIGKILL)")
  died = subprocess.run([sys.executable, "-c", holder, workdir], cwd=ROOT)
  assert died.returncode == -signal.SIGKILL
  assert "os.kill" in open(os.path.join(workdir, ".lock")).read()  # the dead holder's record
  train.train_and_evaluate(tiny_config(data_dir, num_train_steps=2), workdir)


def test_a_full_disk_stops_before_writing_the_checkpoint_and_the_run_resumes(
    data_dir, tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  real = shutil.disk_usage
  def full_after_step_4(path):
    usage = real(path)
    full = os.path.isdir(path) and 4 in checkpoint_steps(os.path.dirname(path))
    return usage._replace(free=1000) if full else usage
  monkeypatch.setattr(checkpoints.shutil, "disk_usage", full_after_step_4)
  with pytest.raises(workdir_lib.WorkdirError, match=(
      r"no space for checkpoint 6 in .*: it needs about [\d.]+ MiB and the disk has 0.0 MiB "
      r"free; .* resumes from step 4")):
    train.train_and_evaluate(tiny_config(data_dir), workdir)
  assert checkpoint_steps(workdir) == [2, 4]
  monkeypatch.undo()
  train.train_and_evaluate(tiny_config(data_dir), workdir)
  assert checkpoint_steps(workdir) == [4, 6, 8]


def test_a_full_disk_under_any_other_write_is_one_line():
  with pytest.raises(workdir_lib.WorkdirError, match="no space left on the device of /x/run"):
    with workdir_lib.writing("/x/run"):
      raise OSError(errno.ENOSPC, "No space left on device", "/x/run/metrics.jsonl")
  with pytest.raises(KeyError):  # anything else passes through unchanged
    with workdir_lib.writing("/x/run"):
      raise KeyError("step")


def _mount_tmpfs(path, size):
  os.makedirs(path, exist_ok=True)
  try:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True,
                   capture_output=True)
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("needs permission to mount a tmpfs (root)")


def test_the_default_model_on_a_2_mib_disk_ends_in_one_line(data_dir, tmp_path):
  """The case as reported: today's default model (4 MiB of state) on a 2 MiB tmpfs."""
  mount = str(tmp_path / "small")
  _mount_tmpfs(mount, "2m")
  try:
    workdir = os.path.join(mount, "run")
    flags = [f"--config.data_dir={data_dir}", "--config.task_options.num_train=512",
             "--config.num_train_steps=10", "--config.checkpoint_every_steps=5",
             "--config.eval_every_steps=10", "--config.attention_maps=0"]
    result = subprocess.run([sys.executable, "-m", "experiments.train",
                             "--config=configs/default.py", f"--workdir={workdir}", *flags],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"workdir error: no space for checkpoint 5 in {workdir}/checkpoints")
    assert "Traceback" not in result.stderr
    assert os.listdir(os.path.join(workdir, "checkpoints")) == []
  finally:
    subprocess.run(["umount", mount], check=False)
