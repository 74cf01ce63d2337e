"""Many hosts: one process per host under JAX's multi-controller runtime (``jax.distributed``).

Every process runs the same program; arrays span the devices of all of them. What the trainer
needs on top of that, in one place:

  initialize(...)  jax.distributed from an explicit coordinator (flags or JAX_COORDINATOR_ADDRESS,
                   JAX_NUM_PROCESSES, JAX_PROCESS_ID), or auto-detected (TPU pods, Slurm, ...)
  agree(fn)        one verdict: fn runs on every process; if it raised on any, every process
                   raises the same error (the lowest-numbered failing process's), so all stop at
                   the same point with the same line, before anything is written
  one_first(fn)    fn on process 0 first (a fresh dataset is generated once), then on the others
  writer()         whether this process writes files (process 0)
  fetch(tree)      global arrays as NumPy values, the same on every process
  preempted(step)  JAX's preemption sync point: a SIGTERM to any process stops all at one step
  Watchdog         ends this process with one line once another one has gone silent

With one process each of these is the plain single-process behaviour at no cost.
"""

from __future__ import annotations

import atexit
import importlib
import os
import socket
import sys
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

ENVIRONMENT = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
               "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}
VERDICT_BYTES = 4096  # the longest error message agreed across processes (longer ones are cut)


class ProcessFailed(RuntimeError):
  """Another process failed with an error this one cannot re-create (its type and message)."""


class CoordinatorError(RuntimeError):
  """--distributed found no coordinator to join, or no key-value store to watch its peers by."""


def define_flags(flags) -> None:
  """The commands' --distributed and its coordinator (absl ``flags``; for their main())."""
  flags.DEFINE_bool("distributed", False, "Join JAX's multi-process runtime, one process per "
                    "host: run the same command on every host (docs/guides/many_hosts.md).")
  flags.DEFINE_string("coordinator_address", None, "With --distributed: HOST:PORT of process "
                      "0, reachable by all (default $JAX_COORDINATOR_ADDRESS, else detected).")
  flags.DEFINE_integer("num_processes", None, "With --distributed: how many processes take "
                       "part (default $JAX_NUM_PROCESSES, else detected).")
  flags.DEFINE_integer("process_id", None, "With --distributed: this process's number, 0 .. "
                       "num_processes - 1 (default $JAX_PROCESS_ID, else detected).")
  flags.DEFINE_integer("heartbeat_timeout", 100, "With --distributed: seconds after which a "
                       "silent process counts as dead (at least 4); the others end with a line "
                       "after half of it.")
  flags.DEFINE_integer("initialization_timeout", 300, "With --distributed: seconds to wait "
                       "for every process to join the coordinator.")


def initialize_from(values) -> None:
  """``initialize`` from the flags of define_flags (absl FLAGS) when --distributed is set."""
  explicit = [name for name in ("coordinator_address", "num_processes", "process_id")
              if values[name].present]
  if not values.distributed:
    if explicit:
      raise CoordinatorError(f"--{explicit[0]} needs --distributed; add it to every process's "
                             "command.")
    return
  initialize(values.coordinator_address, values.num_processes, values.process_id,
             values.heartbeat_timeout, values.initialization_timeout)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, heartbeat_timeout: int = 100,
               initialization_timeout: int = 300) -> None:
  """``jax.distributed.initialize`` with the coordinator given here, else in the environment,
  else auto-detected (TPU pods, Slurm, Open MPI, Kubernetes). A process silent for half of
  ``heartbeat_timeout`` seconds makes the others end with a line (Watchdog), and a process that
  stops alone waits ``heartbeat_timeout`` seconds at most for the others at shutdown. Raises
  CoordinatorError (one line) when no coordinator is given or found, or nothing answers at its
  address within ``initialization_timeout`` seconds."""
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id}
  for name, variable in ENVIRONMENT.items():
    if given[name] is None and os.environ.get(variable):
      given[name] = os.environ[variable]
  if heartbeat_timeout < 4:
    raise CoordinatorError(f"--heartbeat_timeout={heartbeat_timeout} is too short to tell a "
                           "silent process from a busy one; use at least 4 (seconds).")
  try:
    for name in ("num_processes", "process_id"):
      given[name] = None if given[name] is None else int(given[name])
    if given["coordinator_address"] and given["process_id"] not in (None, 0):
      _wait_for_coordinator(given["coordinator_address"], initialization_timeout)
    jax.distributed.initialize(**given, heartbeat_timeout_seconds=heartbeat_timeout,
                               shutdown_timeout_seconds=heartbeat_timeout,
                               initialization_timeout=initialization_timeout)
  except (ValueError, TypeError) as error:
    raise CoordinatorError(
        f"--distributed: no cluster to join ({error}); on a TPU pod slice, Slurm, Open MPI "
        "or Kubernetes it is detected, elsewhere pass --coordinator_address=HOST:PORT "
        "--num_processes=N --process_id=I (or set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, "
        "JAX_PROCESS_ID) to every process.") from None
  if jax.process_count() > 1:
    Watchdog(heartbeat_timeout / 2).start()


class Watchdog(threading.Thread):
  """Ends this process with one line (exit status 1) once another process has shown no sign of
  life for ``silence`` seconds, or the coordinator has been unreachable as long.

  JAX's runtime ends the survivors of a dead process too, but only after its heartbeat timeout
  and with an abort and a stack dump; a collective with the dead process fails at once only when
  its connection was already open. Each process here counts up a key of the coordinator's
  key-value store every second and reads everyone's; set ``silence`` below JAX's heartbeat
  timeout so that this line comes first. A process that ends normally marks its key done."""

  PREFIX = "attention_jax/alive/"

  def __init__(self, silence: float, interval: float = 1.0):
    super().__init__(name="attention_jax-watchdog", daemon=True)
    self.client, self.silence, self.interval = _key_value_store(), silence, interval
    self.me, self.stopped = jax.process_index(), threading.Event()
    atexit.register(self.stop)

  def run(self) -> None:
    count, seen, heard = 0, {}, time.monotonic()
    while not self.stopped.wait(self.interval):
      now, count = time.monotonic(), count + 1
      try:
        self.client.key_value_set(f"{self.PREFIX}{self.me}", str(count), allow_overwrite=True)
        values = dict(self.client.key_value_dir_get(self.PREFIX))
        heard = now
      except Exception:  # noqa: BLE001 -- the coordinator is gone or unreachable
        if now - heard > self.silence:
          self.end("the coordinator (process 0) has been unreachable")
        continue
      for process in range(jax.process_count()):
        value = values.get(f"{self.PREFIX}{process}", "")
        if process == self.me or value == "done":
          continue
        if seen.get(process, (None,))[0] != value:
          seen[process] = (value, now)
        elif now - seen[process][1] > self.silence:
          self.end(f"process {process} has shown no sign of life")

  def end(self, what: str) -> None:
    if not self.stopped.is_set():
      print(f"process {self.me} stopped: {what} for {self.silence:g} s (killed, crashed or "
            "hanging: its own output says why); rerun the same command on every host to resume "
            "from the last checkpoint.", file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(1)

  def stop(self) -> None:
    """Marks this process done (its peers stop watching it) and ends the watch."""
    if not self.stopped.is_set():
      self.stopped.set()
      try:
        self.client.key_value_set(f"{self.PREFIX}{self.me}", "done", allow_overwrite=True)
      except Exception:  # noqa: BLE001 -- nobody left to tell
        pass


#: The JAX releases whose private jax._src.distributed.global_state.client _key_value_store reads.
KEY_VALUE_STORE_CHECKED = "jax 0.10.2 (Python 3.11) to 0.12.0.1 (Python 3.12)"


def _key_value_store():
  """The coordination service's key-value store: the client of JAX's distributed runtime
  (key_value_set, key_value_dir_get)."""
  # Private JAX, kept to this one function: no public API reaches the store (jax.distributed has
  # initialize, is_initialized and shutdown; multihost_utils's process_allgather,
  # broadcast_one_to_all, sync_global_devices and live_devices each wait for the other
  # processes, so they would hang on a silent one, the case the watchdog is for).
  try:
    from jax._src import distributed
    return distributed.global_state.client
  except (ImportError, AttributeError):
    raise CoordinatorError(
        f"jax {jax.__version__} has no jax._src.distributed.global_state.client, the "
        "coordination service's key-value store that --distributed watches its processes "
        f"through (checked with {KEY_VALUE_STORE_CHECKED}); install a jax in that range, as "
        "requirements.txt pins.") from None


def _wait_for_coordinator(address: str, timeout: float) -> None:
  """Waits until something listens at ``address`` (HOST:PORT), as process 0's coordinator does
  once it has started: JAX's runtime would end this process with an abort when it cannot reach
  the coordinator, so an address nobody serves is told in one line here instead."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout
  while True:
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
      return
    except OSError as error:
      if time.monotonic() > deadline:
        raise CoordinatorError(
            f"--distributed: nothing answered at the coordinator address {address} within "
            f"{timeout:g} s ({error}); start the same command on every host (process 0 serves "
            "it), check the address and port, or raise --initialization_timeout.") from None
      time.sleep(0.5)


def first_line(error: BaseException, limit: int = 300) -> str:
  """The first line of an error's message ("" when it has none), cut at ``limit``."""
  return (str(error).strip().splitlines() or [""])[0][:limit]


def agreed(error: BaseException) -> bool:
  """Whether ``error`` was raised by agree, so by every process at the same point."""
  return getattr(error, "raised_by_every_process", False)


def writer() -> bool:
  """Whether this process writes the run's files (one process does, for all)."""
  return jax.process_index() == 0


def agree(fn, *args):
  """``fn(*args)`` on every process, then one verdict: when it raised on any process, every
  process raises the error of the lowest-numbered one that failed, re-created from its type and
  message (ProcessFailed when the type cannot be re-created from a message); this process's own
  error object when it is that very error. Returns fn's result otherwise.

  >>> agree(lambda: 1 + 1)  # with one process, just the call
  2
  """
  if jax.process_count() == 1:
    return fn(*args)
  result, failure, message = None, None, b""
  try:
    result = fn(*args)
  except Exception as error:  # noqa: BLE001 -- agreed below, then raised on every process
    failure = error
    kind = type(error)
    message = f"{kind.__module__}:{kind.__qualname__}\n{error}".encode()[:VERDICT_BYTES]
  local = np.zeros(VERDICT_BYTES, np.uint8)
  local[:len(message)] = np.frombuffer(message, np.uint8)
  verdicts = multihost_utils.process_allgather(local)  # [processes, VERDICT_BYTES]
  for index, verdict in enumerate(verdicts):
    if verdict.any():
      error = _recreated(verdict.tobytes().rstrip(b"\0").decode(errors="replace"), index,
                         failure)
      error.raised_by_every_process = True
      raise error
  return result


def _recreated(verdict: str, index: int, own: Exception | None) -> Exception:
  kind, _, message = verdict.partition("\n")
  same_kind = own is not None and f"{type(own).__module__}:{type(own).__qualname__}" == kind
  if same_kind and str(own).encode()[:len(message.encode())].decode(errors="replace") == message:
    return own
  module, _, name = kind.partition(":")
  try:
    error_type = importlib.import_module(module)
    for part in name.split("."):
      error_type = getattr(error_type, part)
    return error_type(message)
  except Exception:  # noqa: BLE001 -- a type that takes other arguments
    return own if same_kind else ProcessFailed(f"process {index} failed: {name}: {message}")


def one_first(fn, *args):
  """``fn(*args)`` on process 0, then (once it succeeded there) on the other processes: what
  the first one creates on a shared disk, the others find and read. Errors agreed as by agree."""
  first = agree(lambda: fn(*args) if jax.process_index() == 0 else None)
  rest = agree(lambda: fn(*args) if jax.process_index() != 0 else None)
  return first if jax.process_index() == 0 else rest


def fetch(tree):
  """The values of ``tree``'s arrays as NumPy arrays, whole, on every process (a global array
  whose shards live on other processes is gathered)."""
  def value(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))
  return jax.tree.map(value, tree)


def preempted(step: int) -> bool:
  """Whether every process stops after ``step``: JAX's preemption sync point, reached by all at
  the same step once any process received SIGTERM (call it at every step). Single process:
  False (the trainer's own signal handler stops it)."""
  return jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(step)
