"""Step-numbered orbax checkpoints of the training state in <workdir>/checkpoints/.

Orbax writes each checkpoint to a temporary directory and renames it when complete, so a save cut
short (a kill, a full disk) never looks like a checkpoint. A checkpoint that was complete but is
unreadable now (truncated files) is moved to <workdir>/checkpoints_unreadable/<step> with a
warning, and the newest readable one is restored instead.

With several processes, orbax writes one checkpoint from all of them; the free-space check and
which checkpoint restores are agreed by every process (experiments/hosts.py), and the writing
process sets unreadable ones aside. A state restores into the shardings of the template it is
given, whatever devices and processes wrote it.
"""

from __future__ import annotations

import os
import shutil
import sys

import jax
import orbax.checkpoint as ocp

from experiments import hosts
from experiments import workdir as workdir_lib

MARGIN = 1 << 20  # bytes of metadata and file-system overhead allowed for on top of the arrays


class Checkpoints:
  """Saves the state every few steps, keeps the last few, restores the newest readable one."""

  def __init__(self, workdir: str, keep: int, read_only: bool = False):
    """``read_only``: for reading a run back (maybe while it trains): nothing is created,
    cleaned up or set aside."""
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self.read_only = read_only
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                             cleanup_tmp_directories=not read_only,
                                             read_only=read_only,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state) -> None:
    """Saves ``state`` as step ``step``; a WorkdirError, before anything is written, when the
    disk of any process has less free space than the state's size (orbax would fail half-way,
    noisily)."""
    hosts.agree(self._check_space, step, state)
    self.manager.save(step, args=ocp.args.StandardSave(state))
    self.manager.wait_until_finished()

  def _check_space(self, step: int, state) -> None:
    needed = sum(leaf.nbytes for leaf in jax.tree.leaves(state)) + MARGIN
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise workdir_lib.WorkdirError(
          f"no space for checkpoint {step} in {self.directory}: it needs about "
          f"{needed / 2**20:.1f} MiB and the disk has {free / 2**20:.1f} MiB free; free space "
          "or pass a workdir on a larger disk, and run the same command again (it resumes from "
          f"step {self.latest_step() or 0}).")

  def restore(self, template):
    """The newest readable state, shaped and sharded like ``template`` (arrays, or
    ShapeDtypeStructs; those without a sharding go to this process's first device); None when
    there is none.

    Checkpoints newer than the one restored, which failed to restore, are set aside (unless
    read-only). When none restores, nothing is moved and a WorkdirError says so: that is a
    state of another shape (another version of the code), not damage.
    """
    abstract = jax.tree.map(_restorable, template)
    failed = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state = hosts.agree(lambda: self.manager.restore(
            step, args=ocp.args.StandardRestore(abstract)))
      except Exception as error:  # noqa: BLE001 -- judged below, once an older one restores
        failed.append((step, error))
        continue
      if failed and not self.read_only:
        hosts.agree(lambda: [self._set_aside(bad, error, step) for bad, error in failed]
                    if hosts.writer() else None)
        self.manager.reload()
      return state
    if failed:
      step, error = failed[0]
      raise workdir_lib.WorkdirError(
          f"no checkpoint in {self.directory} restores into this run's state (checkpoint {step}: "
          f"{_reason(error)}); it was written by another version of the code or config: pass a "
          "new workdir.")
    return None

  def _set_aside(self, step: int, error: Exception, restored: int) -> None:
    aside = os.path.join(os.path.dirname(self.directory), "checkpoints_unreadable", str(step))
    while os.path.exists(aside):
      aside += "_again"
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    shutil.move(os.path.join(self.directory, str(step)), aside)
    print(f"warning: checkpoint {step} in {self.directory} is unreadable ({_reason(error)}); "
          f"moved it to {aside} and resuming from step {restored}.", file=sys.stderr)

  def close(self):
    self.manager.close()


def _restorable(leaf) -> jax.ShapeDtypeStruct:
  """What orbax restores ``leaf`` as: its shape, dtype and sharding (this process's first device
  when it has none, rather than the devices that wrote it)."""
  sharding = getattr(leaf, "sharding", None) or jax.sharding.SingleDeviceSharding(
      jax.local_devices()[0])
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def _reason(error: Exception) -> str:
  return " ".join(f"{type(error).__name__}: {error}".split())[:200]
