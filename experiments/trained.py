"""A trained model back from its workdir: a training run's or one variant of a sweep.

Both leave config.json and orbax checkpoints of the training state; a sweep variant's state holds
every seed along a leading axis, from which one seed is taken.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import attention_jax as aj
from experiments import checkpoints as checkpoints_lib
from experiments import tasks
from experiments import train as train_lib


@dataclasses.dataclass
class Trained:
  config: ml_collections.ConfigDict
  task: tasks.Task
  model: aj.SequenceClassifier
  params: dict
  step: int


def load(workdir: str, seed_index: int = 0) -> Trained:
  """The latest checkpoint of ``workdir``; ``seed_index`` picks a seed of a vmapped group."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found; pass the workdir of a training run or of a "
                            "sweep variant (<sweep workdir>/variants/<name>).")
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  task = tasks.load_task(config.task, dict(config.task_options), config.data_dir)
  model = aj.SequenceClassifier(train_lib.encoder_config(config, task))
  tokens = jnp.zeros((1, task.max_length), jnp.int32)
  template = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  checkpoints = checkpoints_lib.Checkpoints(workdir, config.keep_checkpoints)
  saved = checkpoints.restore_as_saved()
  checkpoints.close()
  if saved is None:
    raise FileNotFoundError(f"no checkpoint under {workdir}/checkpoints; train it first.")
  step, state = saved
  params = state["params"]
  if np.ndim(jax.tree.leaves(params)[0]) == len(jax.tree.leaves(template)[0].shape) + 1:
    num_seeds = len(jax.tree.leaves(params)[0])
    if not 0 <= seed_index < num_seeds:
      raise ValueError(f"seed_index={seed_index}, but {workdir} holds {num_seeds} seeds; use "
                       f"0..{num_seeds - 1}.")
    params = jax.tree.map(lambda leaf: leaf[seed_index], params)
  fits = (jax.tree.structure(params) == jax.tree.structure(template) and
          all(np.shape(a) == b.shape for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(template))))
  if not fits:
    raise ValueError(f"the checkpoint in {workdir} does not fit the model its config.json "
                     "describes; was the config edited after training?")
  return Trained(config, task, model, jax.tree.map(jnp.asarray, params), step)
