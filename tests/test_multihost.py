"""Training and sweeps as several processes under jax.distributed, for real: 2 processes x 2 CPU
devices on localhost (tests/local_cluster.py), against 1 process x 4 devices and 1 device.

Every job runs under a deadline, so a deadlock fails the test. The module's tests share the
machine's two cores with nothing else of theirs (one xdist group)."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import local_cluster
from experiments import hosts, logbook, trained
from experiments import workdir as workdir_lib
from training_helpers import ROOT, command

pytestmark = pytest.mark.xdist_group("multihost")

# Long enough to signal a run between two of its checkpoints.
LONG = {"num_train_steps": 100, "checkpoint_every_steps": 20, "log_every_steps": 10,
        "eval_every_steps": 50}
# The runs compared across topologies: config overrides and the replicas' (seeds, grid). With 4
# devices in 2 processes: the batch over all 4; replicas across the processes with the sequence
# within each; the sequence across the processes.
RUNS = {
    "data": (LONG, 1, {}),
    "replicas_across_sequence_within": (
        {"mesh.sequence": 2, "mesh.data": 1, "task_options.max_length": 15}, 2,
        {"learning_rate": (1e-3, 3e-3)}),
    "sequence_across": ({"mesh.sequence": 4, "task_options.max_length": 15}, 1, {}),
}
# Trains RUNS (argv: output folder, data_dir) in whatever job starts it.
PROGRAM = r"""
import json, sys
sys.path.insert(0, "tests")
from experiments import hosts, replicas, train
from test_multihost import RUNS
from training_helpers import tiny_config
hosts.initialize(heartbeat_timeout=10)
for name, (overrides, seeds, grid) in RUNS.items():
  config = tiny_config(sys.argv[2], **overrides)
  train.train(config, f"{sys.argv[1]}/{name}", replicas.replicas_of(config, seeds, grid))
"""


def assert_same_metrics(actual_dir, expected_dir, replicas=1, rtol=1e-5):
  for replica in range(replicas):
    actual, expected = logbook.read(actual_dir, replica), logbook.read(expected_dir, replica)
    assert [line["step"] for line in actual] == [line["step"] for line in expected]
    for a, b in zip(actual, expected):
      assert set(a) == set(b)
      for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=1e-6, err_msg=name)


def checkpoint_steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def wait_for_checkpoint(job, workdir, after, timeout=60):
  """Waits until the job has written a checkpoint past step ``after`` (one that an earlier job
  left does not count: a signal sent before the processes set up their handlers would just kill
  them)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.isdir(os.path.join(workdir, "checkpoints")) and any(
        s > after for s in checkpoint_steps(workdir)):
      return
    assert all(p.poll() is None for p in job.processes), "the job ended before the signal"
    time.sleep(0.02)
  job.kill()
  raise AssertionError(f"no checkpoint after step {after} within {timeout} s")


def one_line_each(ended, status):
  """Every process exited with ``status`` and the same last line; returns it."""
  assert [e.returncode for e in ended] == [status] * len(ended), [e.stderr[-2000:] for e in ended]
  lines = {e.last_line for e in ended}
  assert len(lines) == 1, lines
  assert not any("Traceback" in e.stderr for e in ended)
  return lines.pop()


@pytest.fixture(scope="module")
def topologies(data_dir, tmp_path_factory):
  """RUNS trained by 1 process x 4 devices and by 2 processes x 2 devices; the second generates
  its dataset in a fresh data_dir. Returns (one's folder, two's folder, two's data_dir, two's
  processes)."""
  one, two = (str(tmp_path_factory.mktemp(name)) for name in ("one", "two"))
  fresh = str(tmp_path_factory.mktemp("fresh_data"))
  argv = [sys.executable, "-c", PROGRAM]
  ended = local_cluster.run(argv + [one, data_dir], num_processes=1, devices=4, timeout=240)
  assert ended[0].returncode == 0, ended[0].stderr[-3000:]
  ended = local_cluster.run(argv + [two, fresh], timeout=240)
  assert [e.returncode for e in ended] == [0, 0], [e.stderr[-3000:] for e in ended]
  return one, two, fresh, ended


@pytest.mark.parametrize("name", list(RUNS))
def test_two_processes_follow_one_process_with_as_many_devices(topologies, name):
  one, two, _, _ = topologies
  _, seeds, grid = RUNS[name]
  replicas = seeds * max([len(values) for values in grid.values()] + [1])
  assert_same_metrics(f"{two}/{name}", f"{one}/{name}", replicas)


def test_one_process_writes_each_file_once(topologies):
  _, two, fresh, ended = topologies
  workdir = f"{two}/data"
  lines = logbook.read(workdir)
  logged = [line["step"] for line in lines if "loss" in line]
  assert logged == list(range(10, 101, 10))
  assert [line["step"] for line in lines if "eval_loss" in line] == [50, 100]
  events = glob.glob(f"{workdir}/replicas/seed_0/tensorboard/*")
  assert len(events) == 1, events
  assert not glob.glob(f"{two}/**/*.tmp", recursive=True)
  assert "data: 100%" in ended[0].stdout and "%|" not in ended[1].stdout  # progress: process 0
  # the fresh dataset was generated by process 0 alone; process 1 read it
  assert "generating the task" in ended[0].stderr
  assert "generating the task" not in ended[1].stderr
  assert not glob.glob(f"{fresh}/**/incomplete*", recursive=True)


def test_checkpoints_load_on_other_topologies(topologies, data_dir, tmp_path):
  one, two, _, _ = topologies
  for workdir in (f"{one}/replicas_across_sequence_within",
                  f"{two}/replicas_across_sequence_within"):  # 4 devices, 1 or 2 processes -> 1
    run = trained.load(workdir, replica=3)
    assert run.step == 8 and run.replica["name"] == "seed_1-learning_rate_0.003"
  # one process's run resumed by two processes from step 80, then loaded by one process
  workdir = str(tmp_path / "grown")
  shutil.copytree(f"{one}/data", workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "100"))
  ended = local_cluster.run(local_cluster.distributed(command(workdir, data_dir, **LONG)))
  assert [e.returncode for e in ended] == [0, 0], [e.stderr[-3000:] for e in ended]
  assert_same_metrics(workdir, f"{two}/data")
  assert trained.load(workdir).step == 100


def test_sigterm_to_one_then_to_both_then_sigkill_then_the_rerun_ends_as_uninterrupted(
    topologies, data_dir, tmp_path):
  _, two, _, _ = topologies
  workdir = str(tmp_path / "run")
  argv = local_cluster.distributed(command(workdir, data_dir, **LONG))

  job = local_cluster.start(argv)  # SIGTERM to process 1 alone
  wait_for_checkpoint(job, workdir, 0)
  job.signal(1, signal.SIGTERM)
  line = one_line_each(job.wait(), 128 + signal.SIGTERM)
  first = max(checkpoint_steps(workdir))
  assert line.startswith(f"stopped by SIGTERM at step {first}: checkpoint saved; resume with: ")
  assert 20 < first < 100

  job = local_cluster.start(argv)  # SIGTERM to both, at different moments
  wait_for_checkpoint(job, workdir, first)
  job.signal(0, signal.SIGTERM)
  time.sleep(0.3)
  local_cluster.stop_all(job)
  line = one_line_each(job.wait(), 128 + signal.SIGTERM)
  second = max(checkpoint_steps(workdir))
  assert line.startswith(f"stopped by SIGTERM at step {second}: ") and first < second < 100

  job = local_cluster.start(argv)  # SIGKILL to process 1: process 0 ends with a line, soon
  wait_for_checkpoint(job, workdir, second)
  job.signal(1, signal.SIGKILL)
  killed = time.time()
  survivor = job.processes[0]
  survivor.wait(timeout=local_cluster.HEARTBEAT + 10)
  assert time.time() - killed < local_cluster.HEARTBEAT / 2 + 5
  ended = job.wait()
  assert ended[1].returncode == -signal.SIGKILL and ended[0].returncode == 1
  assert "process 0 stopped: " in ended[0].last_line, ended[0].stderr[-2000:]

  ended = local_cluster.run(argv)  # the same command again
  assert [e.returncode for e in ended] == [0, 0], [e.stderr[-3000:] for e in ended]
  assert logbook.read(workdir) == logbook.read(f"{two}/data")


# Joins a job with a 4 s heartbeat timeout, meets the others in one collective, then: process
# argv[1] kills itself, and process 0 stays out of collectives for argv[2] seconds; the others end.
SILENT = r"""
import os, sys, time
import jax
import numpy as np
from jax.experimental import multihost_utils
from experiments import hosts
hosts.initialize(heartbeat_timeout=4)
import jax
multihost_utils.process_allgather(np.zeros(2))
if jax.process_index() == int(sys.argv[1]):
  os.kill(os.getpid(), 9)
time.sleep(float(sys.argv[2]) if jax.process_index() == 0 else 0)
"""


def test_the_watchdog_ends_a_survivor_outside_collectives_and_spares_a_later_finisher():
  start = time.time()
  ended = local_cluster.run([sys.executable, "-c", SILENT, "1", "6"], timeout=60)
  assert [e.returncode for e in ended] == [1, -signal.SIGKILL]
  assert ended[0].last_line.startswith(
      "process 0 stopped: process 1 has shown no sign of life for 2 s"), ended[0].stderr[-2000:]
  assert time.time() - start < 6 + 10  # before process 0 woke up to find it
  # process 1 ends 3 s before process 0 (within JAX's shutdown wait of 4 s): not a death
  ended = local_cluster.run([sys.executable, "-c", SILENT, "-1", "3"], timeout=60)
  assert [e.returncode for e in ended] == [0, 0], [e.stderr[-2000:] for e in ended]


def test_a_busy_workdir_is_refused_by_every_process_and_nothing_changes(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write("{}")
  before = {path: os.path.getmtime(path) for path in glob.glob(f"{workdir}/*")}
  with workdir_lib.owned(workdir):
    ended = local_cluster.run(local_cluster.distributed(command(workdir, data_dir)), timeout=60)
  line = one_line_each(ended, 1)
  assert line.startswith(f"workdir error: {workdir} is in use by process {os.getpid()} on ")
  assert {path: os.path.getmtime(path) for path in glob.glob(f"{workdir}/*")} == before


# Process 1 alone sees a full disk once checkpoint 20 exists.
FULL_ON_ONE = r"""
import os, shutil, sys
from experiments import checkpoints, train
real = shutil.disk_usage
def full_after_step_20(path):
  usage = real(path)
  full = os.path.isdir(os.path.join(path, "20"))
  return usage._replace(free=1000) if full else usage
if os.environ["JAX_PROCESS_ID"] == "1":
  checkpoints.shutil.disk_usage = full_after_step_20
sys.argv = ["experiments.train"] + sys.argv[1:]
train.main()
"""


def test_a_full_disk_seen_by_one_process_stops_every_process_before_the_checkpoint(
    data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  argv = local_cluster.distributed(command(workdir, data_dir, **LONG))
  ended = local_cluster.run([sys.executable, "-c", FULL_ON_ONE] + argv[3:])
  line = one_line_each(ended, 1)
  assert line.startswith(f"workdir error: no space for checkpoint 40 in {workdir}/checkpoints: ")
  assert "0.0 MiB free" in line and "resumes from step 20" in line
  assert checkpoint_steps(workdir) == [20]


# Two variants that differ in a hyperparameter (so they share one compiled step), two seeds each.
SWEEP = """
import ml_collections
from tests.training_helpers import tiny_config
def get_config(data_dir):
  sweep = ml_collections.ConfigDict()
  sweep.train = tiny_config(data_dir, num_train_steps=4, eval_every_steps=2)
  sweep.num_seeds, sweep.vmap_replicas = 2, True
  sweep.grid, sweep.extra_evals = ml_collections.ConfigDict(), ml_collections.ConfigDict()
  sweep.variants = (("slow", {"learning_rate": 1e-3}), ("fast", {"learning_rate": 3e-3}))
  return sweep
"""


def test_a_two_variant_two_seed_sweep(data_dir, tmp_path):
  workdir, config = str(tmp_path / "sweep"), tmp_path / "sweep_config.py"
  config.write_text(SWEEP)
  ended = local_cluster.run(local_cluster.distributed([
      sys.executable, "-m", "experiments.sweep", f"--config={config}:{data_dir}",
      f"--workdir={workdir}"]), timeout=240)
  assert [e.returncode for e in ended] == [0, 0], [e.stderr[-3000:] for e in ended]
  assert "[sweep] wrote" in ended[0].stdout and "[sweep]" not in ended[1].stdout
  for variant in ("slow", "fast"):
    record = workdir_lib.read_result(f"{workdir}/variants/{variant}")
    assert record["status"] == "ok" and record["metrics"]["seed"] == [0, 1]
  with open(f"{workdir}/results.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 4  # a row per variant and seed
  assert not glob.glob(f"{workdir}/**/*.tmp", recursive=True)


@pytest.mark.parametrize("flags, message", [
    (["--distributed"], "--distributed: no cluster to join"),
    (["--process_id=1"], "--process_id needs --distributed"),
    (["--distributed", "--heartbeat_timeout=2"], "--heartbeat_timeout=2 is too short"),
])
def test_the_command_says_what_to_set_without_a_coordinator(flags, message, tmp_path):
  env = {key: value for key, value in os.environ.items()
         if key not in hosts.ENVIRONMENT.values()}
  result = subprocess.run(command(str(tmp_path / "run"), str(tmp_path)) + flags, cwd=ROOT,
                          env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 1 and "Traceback" not in result.stderr
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(message), result.stderr[-2000:]
  assert any(fix in line for fix in ("--coordinator_address=HOST:PORT", "add it to every "
                                     "process", "use at least 4"))
  assert not os.path.exists(tmp_path / "run")


def test_a_job_that_does_not_assemble_ends_in_one_line(tmp_path):
  """Process 1 of 2 alone, with nobody serving the coordinator's address."""
  address = f"localhost:{local_cluster.free_port()}"
  flags = ["--distributed", f"--coordinator_address={address}", "--num_processes=2",
           "--process_id=1", "--initialization_timeout=3"]
  result = subprocess.run(command(str(tmp_path / "run"), str(tmp_path)) + flags, cwd=ROOT,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"--distributed: nothing answered at the coordinator address {address} "
                         "within 3 s (")
  assert line.endswith("or raise --initialization_timeout.") and "\n" not in line
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("missing", ["global_state", "the module"])
def test_a_jax_without_the_private_key_value_store_is_one_line_naming_the_checked_range(
    missing, monkeypatch):
  from jax._src import distributed
  assert hosts._key_value_store() is distributed.global_state.client  # the pinned jax has it
  if missing == "global_state":
    monkeypatch.delattr(distributed, "global_state")
  else:
    monkeypatch.delattr(sys.modules["jax._src"], "distributed")
    monkeypatch.setitem(sys.modules, "jax._src.distributed", None)  # import raises ImportError
  with pytest.raises(hosts.CoordinatorError) as raised:
    hosts._key_value_store()
  line = str(raised.value)
  assert "\n" not in line and hosts.KEY_VALUE_STORE_CHECKED in line
  assert line.startswith(f"jax {jax.__version__} has no jax._src.distributed.global_state.client")
