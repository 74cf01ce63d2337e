"""Step-numbered orbax checkpoints of the training state in <workdir>/checkpoints/.

Orbax writes each checkpoint to a temporary directory and renames it when complete, so a save cut
short (a kill, a full disk) never looks like a checkpoint. A checkpoint that was complete but is
unreadable now (truncated files) is moved to <workdir>/checkpoints_unreadable/<step> with a
warning, and the newest readable one is restored instead.
"""

from __future__ import annotations

import os
import shutil
import sys

import jax
import orbax.checkpoint as ocp

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
    disk has less free space than the state's size (orbax would fail half-way, noisily)."""
    needed = sum(leaf.nbytes for leaf in jax.tree.leaves(state)) + MARGIN
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise workdir_lib.WorkdirError(
          f"no space for checkpoint {step} in {self.directory}: it needs about "
          f"{needed / 2**20:.1f} MiB and the disk has {free / 2**20:.1f} MiB free; free space "
          "or pass a workdir on a larger disk, and run the same command again (it resumes from "
          f"step {self.latest_step() or 0}).")
    self.manager.save(step, args=ocp.args.StandardSave(state))
    self.manager.wait_until_finished()

  def restore(self, template):
    """The newest readable state, shaped and sharded like ``template``; None when there is none.

    Checkpoints newer than the one restored, which failed to restore, are set aside (unless
    read-only). When none restores, nothing is moved and a WorkdirError says so: that is a
    state of another shape (another version of the code), not damage.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    failed = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
      except Exception as error:  # noqa: BLE001 -- judged below, once an older one restores
        failed.append((step, error))
        continue
      for bad, error in failed:
        self._set_aside(bad, error, step)
      return state
    if failed:
      step, error = failed[0]
      raise workdir_lib.WorkdirError(
          f"no checkpoint in {self.directory} restores into this run's state (checkpoint {step}: "
          f"{_reason(error)}); it was written by another version of the code or config: pass a "
          "new workdir.")
    return None

  def _set_aside(self, step: int, error: Exception, restored: int) -> None:
    if self.read_only:
      return
    aside = os.path.join(os.path.dirname(self.directory), "checkpoints_unreadable", str(step))
    while os.path.exists(aside):
      aside += "_again"
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    shutil.move(os.path.join(self.directory, str(step)), aside)
    self.manager.reload()
    print(f"warning: checkpoint {step} in {self.directory} is unreadable ({_reason(error)}); "
          f"moved it to {aside} and resuming from step {restored}.", file=sys.stderr)

  def close(self):
    self.manager.close()


def _reason(error: Exception) -> str:
  return " ".join(f"{type(error).__name__}: {error}".split())[:200]
