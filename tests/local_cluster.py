"""A job of N processes on this machine, as JAX's multi-process runtime runs one per host.

Each process gets its own CPU devices and joins the coordinator on a free localhost port through
the environment the training commands read (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID); collectives between processes go through gloo, JAX's CPU default. Every wait has
a deadline, after which the whole job is killed: a deadlock fails a test instead of hanging it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import time

from training_helpers import ROOT

HEARTBEAT = 10  # --heartbeat_timeout of the jobs here: a silent process ends the others in 5 s


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def environment(process_id: int, num_processes: int, devices: int, port: int) -> dict:
  flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()  # the device count is ours
           if not flag.startswith("--xla_force_host_platform_device_count")]
  return {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu",
          "JAX_NUM_CPU_DEVICES": str(devices),
          "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": str(num_processes),
          "JAX_PROCESS_ID": str(process_id)}


@dataclasses.dataclass
class Job:
  """The processes of one job, started together; ``wait`` collects them."""
  processes: list[subprocess.Popen]
  deadline: float

  def wait(self) -> list[Ended]:
    ended = []
    for process in self.processes:
      try:
        out, err = process.communicate(timeout=max(self.deadline - time.time(), 0.1))
      except subprocess.TimeoutExpired:
        self.kill()
        raise AssertionError(f"the job did not end by its deadline (a deadlock?); process "
                             f"{self.processes.index(process)} was still running") from None
      ended.append(Ended(process.returncode, out, err))
    return ended

  def kill(self) -> None:
    for process in self.processes:
      if process.poll() is None:
        process.kill()
        process.communicate()

  def signal(self, process_id: int, signum: int) -> None:
    self.processes[process_id].send_signal(signum)


@dataclasses.dataclass
class Ended:
  returncode: int
  stdout: str
  stderr: str

  @property
  def last_line(self) -> str:
    """The last line the process itself wrote to stderr: the JAX runtime's own log lines (glog's
    "W1127 13:59:53.446134 16774 preemption_notifier.cc:90] SIGTERM caught ...", which a second
    signal can print after the program's last words) are not the program's."""
    lines = [line for line in self.stderr.strip().splitlines() if not _RUNTIME_LOG.match(line)]
    return (lines or [""])[-1]


_RUNTIME_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.]+:\d+\] ")


def start(argv: list[str], num_processes: int = 2, devices: int = 2, timeout: float = 120,
          per_process: dict | None = None) -> Job:
  """Starts ``argv`` (a command reading the coordinator from the environment) as processes
  0 .. num_processes - 1 with ``devices`` CPU devices each; ``per_process``: {process id: extra
  environment}. The job must end within ``timeout`` seconds."""
  port = free_port()
  processes = [subprocess.Popen(
      argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env={**environment(i, num_processes, devices, port), **(per_process or {}).get(i, {})})
      for i in range(num_processes)]
  return Job(processes, time.time() + timeout)


def run(argv: list[str], **options) -> list[Ended]:
  """Starts the job (as ``start``) and waits for all of its processes."""
  return start(argv, **options).wait()


def distributed(argv: list[str]) -> list[str]:
  """A training or sweep command joined to the job's coordinator."""
  return argv + ["--distributed", f"--heartbeat_timeout={HEARTBEAT}"]


def stop_all(job: Job) -> None:
  """Sends SIGTERM to every process of a job that is still running."""
  for process in job.processes:
    if process.poll() is None:
      process.send_signal(signal.SIGTERM)
