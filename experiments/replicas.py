"""Replicas: the runs that one compiled step trains together, and the devices they lie on.

A run's state has a leading replica axis; a single run is one replica, a sweep variant's replicas
are its seeds times its hyperparameter grid. ``replicas_of`` lists them, ``over_replicas`` maps a
step over them, and ``device_mesh`` lays replicas, batch and sequence over the devices (mesh
axes "replica", "data" and "sequence").
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from experiments import config_check
from experiments import steps as steps_lib


def replicas_of(config, num_seeds: int = 1, grid: dict | None = None) -> list[dict]:
  """The replicas of a run: seeds config.seed .. + num_seeds - 1 for every combination of the
  ``grid`` ({hyperparameter: values}); the rest of the hyperparameters come from ``config``.
  Each is {"name", "seed", <every name in steps.HYPERPARAMETERS>}, seeds innermost."""
  grid = {name: tuple(values) for name, values in (grid or {}).items()}
  for name, values in grid.items():
    if name not in steps_lib.HYPERPARAMETERS or not values:
      raise config_check.ConfigError(
          f"grid.{name}: a grid holds non-empty tuples of {list(steps_lib.HYPERPARAMETERS)}.")
  replicas = []
  for values in itertools.product(*grid.values()):
    chosen = dict(zip(grid, values))
    for seed in range(config.seed, config.seed + num_seeds):
      name = "-".join([f"seed_{seed}"] + [f"{k}_{v:g}" for k, v in chosen.items()])
      hparams = {k: float(chosen.get(k, config[k])) for k in steps_lib.HYPERPARAMETERS}
      replicas.append({"name": name, "seed": seed, **hparams})
  names = [replica["name"] for replica in replicas]
  if len(set(names)) != len(names):
    raise config_check.ConfigError(f"the grid {grid} gives replicas of the same name ({names}); "
                                   "use distinct values that differ in 6 significant digits.")
  return replicas


def over_replicas(fn, in_axes=0):
  """``jax.vmap(fn, in_axes)`` over the leading replica axis of the arguments whose axis is 0,
  except that one replica runs unbatched, its axis taken off and put back on the results. The
  same numbers either way; XLA's CPU backend runs the unbatched program faster
  (docs/performance_history.md, "One replica runs unbatched")."""
  batched = jax.vmap(fn, in_axes=in_axes)

  def run(*args):
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    stacked = [arg for arg, axis in zip(args, axes) if axis == 0]
    if any(jnp.ndim(x) == 0 or jnp.shape(x)[0] != 1 for x in jax.tree.leaves(stacked)):
      return batched(*args)
    args = [jax.tree.map(lambda x: x[0], arg) if axis == 0 else arg
            for arg, axis in zip(args, axes)]
    return jax.tree.map(lambda x: x[None], fn(*args))
  return run


def device_mesh(num_replicas: int, data: int = 0, sequence: int = 1) -> Mesh:
  """Devices as ("replica", "data", "sequence"): ``sequence`` along the sequence, ``data`` (0:
  the rest) along the batch, and the replicas over what is left. With data = 0, as many replica
  shards as divide both counts. Devices come in process order, so an axis spans processes when
  it is longer than a process's devices."""
  devices = jax.devices()
  if sequence <= 0 or len(devices) % sequence:
    raise config_check.ConfigError(f"mesh.sequence={sequence} must divide the {len(devices)} "
                                   "devices.")
  rest = len(devices) // sequence
  if data:
    across = rest // data
    if data < 0 or rest % data or num_replicas % across:
      raise config_check.ConfigError(
          f"mesh.data={data} must divide the {rest} devices left by mesh.sequence={sequence}, "
          f"leaving a divisor of the {num_replicas} replicas; or use mesh.data=0 (automatic).")
  else:
    across = math.gcd(num_replicas, rest)
  return Mesh(np.array(devices).reshape(across, rest // across, sequence),
              ("replica", "data", "sequence"))


def checked_mesh(config, num_replicas: int) -> Mesh:
  """The device mesh of ``config``, once the config is valid and its batch splits over it."""
  config_check.validate(config)
  config_check.check_gpu_determinism_flags(config)
  mesh = device_mesh(num_replicas, config.mesh.data, config.mesh.sequence)
  config_check.check_batch_split(config.batch_size, mesh.shape["data"])
  return mesh
