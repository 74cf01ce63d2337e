"""Step-numbered orbax checkpoints of the training state in <workdir>/checkpoints/."""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  """Saves the state every few steps, keeps the last few, restores the latest."""

  def __init__(self, workdir: str, keep: int):
    self.manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state))
    self.manager.wait_until_finished()

  def restore(self, template):
    """The latest state, shaped and sharded like ``template``; None when there is none."""
    step = self.latest_step()
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def restore_as_saved(self):
    """(step, state) of the latest checkpoint as saved, without a template; None when there is
    none. For reading a run back when its exact structure is not known in advance."""
    step = self.latest_step()
    return None if step is None else (step, self.manager.restore(step))

  def close(self):
    self.manager.close()
