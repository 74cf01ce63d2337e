"""A workdir's bookkeeping: who owns it, which config it holds, its replicas, its result records.

Layout, the same for a single run, a group of seeds and a sweep variant:

  <workdir>/config.json          the training config (claim)
  <workdir>/replicas.json        [{"name", "seed", <hyperparameters>}], in the order of the axis
  <workdir>/checkpoints/<step>/  orbax checkpoints of the state, leading replica axis always
  <workdir>/replicas/<name>/     metrics.jsonl and TensorBoard events of one replica
  <workdir>/.lock                held (flock) by the live process that owns the workdir
  <workdir>/result.json          a sweep variant's record, written when it ends
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time

from experiments import hosts
from experiments.config_check import ConfigError


class WorkdirError(RuntimeError):
  """The workdir cannot be used as asked: owned by another process, or its disk is full."""


# Fields a run may change between a start and a resume: they do not change what is trained.
BOOKKEEPING = ("eval_every_steps", "log_every_steps", "checkpoint_every_steps",
               "keep_checkpoints", "attention_maps", "data_dir", "mesh.data", "mesh.sequence",
               "mesh.strategy")
# A single run (or group of seeds) may also be resumed with more steps: it continues where it
# stopped. A sweep holds its variants to exactly their config.
RESUMABLE = BOOKKEEPING + ("num_train_steps",)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def flatten(tree, prefix=""):
  """{"model": {"d_model": 64}} -> {"model.d_model": 64}."""
  flat = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{name}."))
    else:
      flat[prefix + name] = value
  return flat


def disk_full(error: BaseException) -> bool:
  """Whether ``error``, or an error it was raised from, is a full disk or quota."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in DISK_FULL:
      return True
    if "No space left on device" in str(error):  # tensorstore reports it in its message
      return True
    error = error.__cause__ or error.__context__
  return False


@contextlib.contextmanager
def writing(workdir: str):
  """Turns a full disk under the block into a one-line WorkdirError naming the workdir."""
  try:
    yield
  except Exception as error:
    if not disk_full(error):
      raise
    raise WorkdirError(f"no space left on the device of {os.path.abspath(workdir)}; free space "
                       "or pass a workdir on a larger disk, and run the same command again (it "
                       "resumes from the last complete checkpoint).") from None


def write_atomically(path: str, text: str) -> None:
  """Replaces ``path`` with ``text`` all at once: a full disk leaves the old file as it was. The
  temporary file's name is this process's own, so concurrent writers never share one."""
  temporary = f"{path}.{socket.gethostname()}-{os.getpid()}.tmp"
  try:
    with open(temporary, "w") as f:
      f.write(text)
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def changed_fields(config, workdir: str, allowed=BOOKKEEPING) -> list[str]:
  """Fields (outside ``allowed``) whose value differs from the config.json already in
  ``workdir``; [] when there is none."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    before = flatten(json.load(f))
  now = flatten(json.loads(config.to_json_best_effort()))
  return sorted(name for name in set(before) | set(now)
                if before.get(name) != now.get(name) and name not in allowed)


def check_is_directory(workdir: str) -> None:
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"workdir {workdir} is a file, not a directory; pass a directory (a new "
                      "path starts a new run).")


def claim(config, workdir: str, allowed=BOOKKEEPING) -> None:
  """Writes config.json to ``workdir``, refusing (ConfigError) when the workdir already holds a
  run of a different config, so a resume never mixes two configs."""
  check_is_directory(workdir)
  changed = changed_fields(config, workdir, allowed)
  if changed:
    raise ConfigError(f"{workdir} holds a run of a different config ({', '.join(changed)} "
                      "changed); use a new workdir, or restore those values to resume it.")
  with writing(workdir):
    os.makedirs(workdir, exist_ok=True)
    write_atomically(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))


def command_line() -> str:
  """The command that started this process, as it could be typed again."""
  return shlex.join(getattr(sys, "orig_argv", sys.argv))


@contextlib.contextmanager
def owned(workdir: str):
  """Holds ``workdir`` for this process (an flock on <workdir>/.lock) for the block. A second
  process is refused at once with a WorkdirError naming the holder; the kernel drops the lock
  when its holder dies, so a killed run never blocks its restart. In a multi-process run the
  writing process holds it for all, and every process is refused with its error."""
  with contextlib.ExitStack() as stack:
    hosts.agree(lambda: stack.enter_context(_locked(workdir)) if hosts.writer()
                else check_is_directory(workdir))
    yield


@contextlib.contextmanager
def _locked(workdir: str):
  check_is_directory(workdir)
  with writing(workdir):
    os.makedirs(workdir, exist_ok=True)
    descriptor = os.open(os.path.join(workdir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or "another process"
      raise WorkdirError(f"{workdir} is in use by {holder}; wait for it, stop it, or pass "
                         "another workdir.") from None
    except OSError:  # a file system without flock (some network mounts): run unguarded
      print(f"warning: {workdir} cannot be locked on this file system; make sure no other "
            "process uses it.", file=sys.stderr)
    holder = (f"process {os.getpid()} on {socket.gethostname()} (since "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {command_line()})")
    with writing(workdir):
      os.ftruncate(descriptor, 0)
      os.pwrite(descriptor, holder.encode(), 0)
    yield
  finally:
    os.close(descriptor)  # releases the lock


def write_replicas(workdir: str, replicas: list[dict]) -> None:
  write_atomically(os.path.join(workdir, "replicas.json"), json.dumps(replicas, indent=1))


def read_replicas(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "replicas.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found; pass the workdir of a training run or of a "
                            "sweep variant (<sweep workdir>/variants/<name>).")
  with open(path) as f:
    return json.load(f)


def replica_names(workdir: str) -> list[str] | None:
  """The names in the workdir's replicas.json, in axis order; None before a run started there."""
  if not os.path.exists(os.path.join(workdir, "replicas.json")):
    return None
  return [replica["name"] for replica in read_replicas(workdir)]


def replica_dir(workdir: str, name: str) -> str:
  return os.path.join(workdir, "replicas", name)


def read_result(directory: str) -> dict | None:
  """The result.json record of a sweep variant, None when it has none (not yet ended)."""
  path = os.path.join(directory, "result.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_result(directory: str, record: dict) -> None:
  with writing(directory):
    write_atomically(os.path.join(directory, "result.json"), json.dumps(record, indent=1))
