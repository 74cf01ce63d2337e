"""A trained model back from its workdir (a training run's, or one variant of a sweep).

Every workdir holds config.json, replicas.json and orbax checkpoints of the state with a leading
replica axis; ``load`` restores that state into the shape the config and replica list describe
and takes one replica out of it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import ml_collections

import attention_jax as aj
from experiments import checkpoints as checkpoints_lib
from experiments import tasks
from experiments import train as train_lib
from experiments import workdir as workdir_lib


@dataclasses.dataclass
class Trained:
  config: ml_collections.ConfigDict
  task: tasks.Task
  model: aj.SequenceClassifier
  params: dict
  step: int
  replica: dict  # its entry of replicas.json: name, seed, hyperparameters


def load(workdir: str, replica: int = 0) -> Trained:
  """The newest checkpoint of ``workdir``; ``replica`` is an index on its replica axis."""
  replicas = workdir_lib.read_replicas(workdir)
  if not 0 <= replica < len(replicas):
    raise ValueError(f"replica={replica}, but {workdir} holds {len(replicas)} replicas "
                     f"({[r['name'] for r in replicas]}); use 0..{len(replicas) - 1}.")
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  task, model, _, init = train_lib.setup(config, replicas)
  checkpoints = checkpoints_lib.Checkpoints(workdir, config.keep_checkpoints, read_only=True)
  state = checkpoints.restore(jax.eval_shape(init))
  checkpoints.close()
  if state is None:
    raise FileNotFoundError(f"no checkpoint under {workdir}/checkpoints; train it first.")
  params = jax.tree.map(lambda leaf: leaf[replica], state.params)
  return Trained(config, task, model, params, int(state.step[replica]), replicas[replica])


def at_rate(variant_dir: str, learning_rate: float) -> list[Trained]:
  """Every replica of a sweep variant trained at ``learning_rate``: in the variant's workdir, or
  in the one experiments.sweep added to bracket its grid (<variant_dir>/bracket/<rate>/)."""
  extensions = os.path.join(variant_dir, "bracket")
  workdirs = [variant_dir] + ([os.path.join(extensions, name)
                               for name in sorted(os.listdir(extensions))]
                              if os.path.isdir(extensions) else [])
  runs = [load(workdir, index) for workdir in workdirs
          for index, replica in enumerate(workdir_lib.read_replicas(workdir))
          if math.isclose(replica["learning_rate"], learning_rate, rel_tol=1e-6)]
  if not runs:
    raise ValueError(f"{variant_dir} trained no replica at learning_rate={learning_rate}.")
  return runs
