"""The one training loop: a stack of replicas (seeds x hyperparameters) trained by one compiled
step.

  python -m experiments.train --config=configs/default.py --workdir=/tmp/run [--config.seed=1]

``train_and_evaluate(config, workdir)`` trains one replica (Colab calls it directly);
``train(config, workdir, replicas)`` trains several at once, as a sweep variant does. The state
has a leading replica axis in every mode; replicas and batch shard over all devices (mesh axes
"replica", "data" and "sequence", config.mesh). The workdir's layout is described in
experiments/workdir.py. A run resumes
from its newest readable checkpoint when started again with the same command; SIGTERM or SIGINT
finishes the step, saves a checkpoint and stops with the command that resumes.

Many hosts (one process each; docs/guides/many_hosts.md): add --distributed to the same command on
every host; experiments/hosts.py says what the processes agree on.
"""

from __future__ import annotations

if __name__ == "__main__":  # before jax is imported; experiments/launch.py says why
  from experiments import launch
  launch.with_huge_pages()

import contextlib
import functools
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import attention_jax as aj
from experiments import checkpoints as checkpoints_lib
from experiments import config_check
from experiments import hosts
from experiments import input_pipeline
from experiments import logbook
from experiments import optim
from experiments import oracles
from experiments import probes as probes_lib
from experiments import steps as steps_lib
from experiments import tasks
from experiments import workdir as workdir_lib


class NonFiniteError(RuntimeError):
  """A non-finite loss or gradient norm stopped the run."""


class Interrupted(RuntimeError):
  """SIGTERM or SIGINT stopped the run after a checkpoint of its last step."""

  def __init__(self, signum: int, step: int):
    self.signum, self.step = signum, step
    super().__init__(f"{signal.Signals(signum).name} at step {step}: checkpoint saved; resume "
                     f"with: {workdir_lib.command_line()}")


def encoder_config(config, task: tasks.Task, mesh: Mesh | None = None) -> aj.EncoderConfig:
  """The model of ``config``; with a "sequence" axis of ``mesh`` longer than 1, its attention
  runs context-parallel over it."""
  model = config.model
  sharded = mesh is not None and mesh.shape.get("sequence", 1) > 1
  return aj.EncoderConfig(
      vocab_size=task.vocab_size, d_model=model.d_model, num_heads=model.num_heads,
      num_layers=model.num_layers, mlp_dim=model.mlp_dim,
      max_length=max(model.max_length, task.max_length),
      positional_encoding=model.positional_encoding,
      attention_scale=config_check.attention_scale(model.attention_scale),
      head_dim=model.head_dim, normalize_qk=model.normalize_qk,
      query_init_scale=model.query_init_scale,
      dropout_rate=model.dropout_rate, attention_dropout_rate=model.attention_dropout_rate,
      pre_layer_norm=model.pre_layer_norm, attention_impl=model.attention_impl or None,
      input_features=task.input_features, pad_id=task.pad_id, num_classes=task.num_classes,
      pooling=model.pooling,
      head_variant=model.head_variant, moh_shared_heads=model.moh_shared_heads,
      moh_routed_heads=model.moh_routed_heads, overlap_schedule=model.overlap_schedule,
      attention_fn=aj.ContextParallel(mesh, "sequence", config.mesh.strategy) if sharded else None)


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
  same numbers either way, but XLA's CPU backend compiles a batch of one replica into slower
  code: unbatched, the training step took 0.88x / 0.97x / 0.96x as long at the three sizes of
  scripts/benchmark_train.py (docs/performance.md)."""
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


def setup(config, replicas: list[dict], mesh: Mesh | None = None):
  """(task, model, tx, init) of a run; init() -> the stacked step-0 state, jitted. A dataset
  not yet generated is generated by the first process while the others wait."""
  task = hosts.one_first(tasks.load_task, config.task, dict(config.task_options), config.data_dir)
  head = aj.TokenClassifier if task.token_level else aj.SequenceClassifier
  model = head(encoder_config(config, task, mesh))
  tx = optim.optimizer(config)
  return task, model, tx, functools.partial(initial_states, model, tx, task.max_length, replicas,
                                            start=starting_point(config, model, task))


def starting_point(config, model, task):
  """None (a random initialisation), or with ``config.init`` "oracle" (anchor, noise): the task's
  hand-set solution, to which each replica adds ``init_noise`` x its random initialisation."""
  if config.init == "random":
    return None
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          steps_lib.example_inputs(model.config, task.max_length))["params"]
  try:
    anchor = oracles.solution(config.task, model, shapes, dict(config.task_options),
                              beta=config.init_beta or None)
  except ValueError as error:
    raise config_check.ConfigError(f"init='oracle': {error}") from None
  return anchor, config.init_noise


def initial_states(model, tx, max_length: int, replicas: list[dict], sharding=None, start=None):
  """The step-0 states of ``replicas`` stacked on a leading replica axis, jitted; ``start``:
  starting_point's."""
  seeds = jnp.array([replica["seed"] for replica in replicas])
  hparams = {name: jnp.array([replica[name] for replica in replicas], jnp.float32)
             for name in steps_lib.HYPERPARAMETERS}
  initial = jax.vmap(functools.partial(steps_lib.initial_state, model, tx, max_length,
                                       start=start))
  return jax.jit(initial, out_shardings=sharding)(seeds, hparams)


def train_step_fn(config, model, tx, num_classes: int, sharding=None):
  """The loop's compiled step over the replica axis: (state [R], batch {"tokens": [R, B, T],
  "labels": [R, B(, T)]}) -> (state [R], metrics [R]); the state's buffers are donated. The
  benchmark (scripts/benchmark_train.py) times this same function."""
  return jax.jit(over_replicas(functools.partial(
      steps_lib.train_step, model=model, tx=tx, learning_rate=optim.learning_rate(config),
      compute_dtype=jnp.dtype(config.compute_dtype), label_smoothing=config.label_smoothing,
      num_classes=num_classes)), out_shardings=None if sharding is None else (sharding, sharding),
      donate_argnums=0)


@contextlib.contextmanager
def stop_requests():
  """SIGTERM and SIGINT received during the block, collected in the yielded list instead of
  killing the process (a second SIGINT interrupts at once). Only the main thread gets signals.
  With several processes SIGTERM is left to JAX's preemption service, which makes every process
  stop at the same step (hosts.preempted), and SIGINT is passed on to it as a SIGTERM."""
  received = []
  if threading.current_thread() is not threading.main_thread():
    yield received
    return

  def handler(signum, frame):
    if received and signum == signal.SIGINT:
      raise KeyboardInterrupt
    received.append(signum)

  def to_preemption_service(signum, frame):
    os.kill(os.getpid(), signal.SIGTERM)
  if jax.process_count() > 1:
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, to_preemption_service)}
  else:
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield received
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def train(config, workdir: str, replicas: list[dict], *, extra_evals: dict | None = None,
          probes: bool = False, allowed=workdir_lib.RESUMABLE) -> dict:
  """Trains ``replicas`` (see replicas_of) of ``config`` together, in ``workdir``.

  Returns lists over replicas: "name", "seed", the hyperparameters, eval_loss and eval_accuracy
  (eval_nmse for real targets; and <name>_loss/_accuracy for each of ``extra_evals``, name -> task-option overrides of an
  extra test set), with ``probes`` the probe summaries at initialisation ("init_*") and at the end
  ("final_*"), "diverged_at" (the step whose loss or gradient was not finite, 0 if none: such a
  replica is frozen there, its evaluations are NaN, and the others train on; the run stops only
  when every replica has diverged), "parameters" (the model's count) and "seconds", the wall time
  of the whole run.
  """
  started = time.perf_counter()
  mesh = hosts.agree(checked_mesh, config, len(replicas))
  with workdir_lib.owned(workdir), workdir_lib.writing(workdir):
    hosts.agree(_claim, config, workdir, replicas, allowed)
    return _loop(config, workdir, replicas, mesh, extra_evals or {}, probes, started)


def _claim(config, workdir, replicas, allowed) -> None:
  """Writes config.json and replicas.json (the writing process), refusing a workdir that holds
  another config or other replicas."""
  if not hosts.writer():
    return
  workdir_lib.claim(config, workdir, allowed)
  names, before = [r["name"] for r in replicas], workdir_lib.replica_names(workdir)
  if before not in (None, names):
    raise config_check.ConfigError(
        f"{workdir} holds replicas {before}, not {names}; use a new workdir, or the seeds and "
        "grid it was started with.")
  workdir_lib.write_replicas(workdir, replicas)


def _loop(config, workdir, replicas, mesh, extra_evals, probes, started) -> dict:
  task, model, tx, init = setup(config, replicas, mesh)
  extra_tests = {}
  for name, overrides in extra_evals.items():
    extra = hosts.one_first(tasks.load_task, config.task,
                            {**dict(config.task_options), **dict(overrides)}, config.data_dir)
    if extra.max_length > model.config.max_length:
      raise config_check.ConfigError(
          f"the '{name}' evaluation has sequences of length {extra.max_length} but the model "
          f"supports {model.config.max_length}; set model.max_length >= {extra.max_length}.")
    extra_tests[name] = extra.test
  by_replica = NamedSharding(mesh, PartitionSpec("replica"))
  by_data = NamedSharding(mesh, PartitionSpec("data"))
  by_both = NamedSharding(mesh, PartitionSpec("replica", "data"))
  state = init(by_replica)
  probe = _prober(model, task, config) if probes else None
  init_probes = probe("init", state.params) if probes else {}  # recomputed after a resume
  checkpoints = checkpoints_lib.Checkpoints(workdir, config.keep_checkpoints)
  restored = checkpoints.restore(state)
  state = state if restored is None else restored
  start_step = int(state.step[0])
  if start_step >= config.num_train_steps and hosts.writer():
    print(f"{workdir} already finished its {config.num_train_steps} steps; evaluating its last "
          "checkpoint (another --workdir, or a larger num_train_steps, trains again)")

  compute_dtype = jnp.dtype(config.compute_dtype)
  step_fn = train_step_fn(config, model, tx, task.num_classes, by_replica)
  everywhere = NamedSharding(mesh, PartitionSpec())  # sums every process reads whole
  eval_fn = jax.jit(over_replicas(functools.partial(
      steps_lib.eval_step, model=model, compute_dtype=compute_dtype,
      num_classes=task.num_classes), in_axes=(0, None)), out_shardings=everywhere)
  max_logit_fn = jax.jit(over_replicas(functools.partial(probes_lib.max_attention_logit, model)),
                         out_shardings=by_replica)
  sources = {seed: input_pipeline.TrainBatches(task.train, config.batch_size, seed)
             for seed in sorted({replica["seed"] for replica in replicas})}

  def next_batch(step):  # {"tokens": [R, B, T], "labels": [R, B(, T)]}, replica r's from its seed
    by_seed = {seed: source.batch(step) for seed, source in sources.items()}
    stacked = {name: np.stack([by_seed[replica["seed"]][name] for replica in replicas])
               for name in ("tokens", "labels")}
    return input_pipeline.shard(stacked, by_both)

  def evaluate(state):  # NaN for a diverged replica
    metrics, diverged = {}, hosts.fetch(state.diverged_at) > 0
    for prefix, split in {"eval": task.test, **extra_tests}.items():
      batches = (input_pipeline.shard(batch, by_data)
                 for batch in input_pipeline.eval_batches(split, config.batch_size))
      metrics.update(steps_lib.evaluate(eval_fn, state.params, batches, prefix))
    return {name: np.where(diverged, np.nan, values).tolist() for name, values in metrics.items()}

  logs = [logbook.Logbook(workdir_lib.replica_dir(workdir, replica["name"]), start_step)
          for replica in replicas] if hosts.writer() else []
  def log(step, metrics, extra=None):
    for index, replica_log in enumerate(logs):
      replica_log.write(step, {name: float(values[index]) for name, values in metrics.items()},
                        extra)

  tokens_per_step = len(replicas) * config.batch_size * task.max_length
  # The bar starts after the first step, which compiles the program, so that its rate and ETA
  # count compiled steps only (a first ETA of an hour was the compilation).
  progress = None
  say = (lambda line: progress.write(line) if progress else print(line, flush=True)
         ) if hosts.writer() else (lambda line: None)
  if start_step < config.num_train_steps:
    say(f"compiling the training step ({len(replicas)} replica(s)); the progress bar starts when "
        "it runs")
  eval_metrics = {}
  reported = set(_diverged(state, replicas))  # diverged before a resume: already said
  clock = time.perf_counter()
  try:
    with stop_requests() as received:
      for step in range(start_step + 1, config.num_train_steps + 1):
        # Nothing here waits for the device except at log, eval and checkpoint steps: the host
        # prepares the next batch while the step runs.
        batch = next_batch(step - 1)
        state, metrics = step_fn(state, batch)
        if progress is None:
          progress = tqdm.tqdm(total=config.num_train_steps, initial=step, mininterval=2.0,
                               desc=os.path.basename(os.path.normpath(workdir)),
                               file=sys.stdout, disable=not hosts.writer())
        else:
          progress.update(1)
        log_now, eval_now, save_now = steps_lib.due(step, config)
        stop = received[0] if received else signal.SIGTERM if hosts.preempted(step) else None
        if log_now or eval_now or save_now or stop:
          reported |= hosts.agree(_check_diverged, state, replicas, reported,
                                  checkpoints.latest_step(), say)
        if log_now:
          metrics = hosts.fetch({"max_attention_logit": max_logit_fn(state.params,
                                                                     batch["tokens"]), **metrics})
          throughput = tokens_per_step * (step - start_step) / (time.perf_counter() - clock)
          log(step, metrics, {"tokens_per_second": throughput})
          progress.set_postfix(refresh=False, tok_s=f"{throughput:.0f}", **{
              name: f"{np.mean(metrics[name]):.3f}" for name in ("loss", "accuracy", "nmse")
              if name in metrics})
        if eval_now:
          eval_metrics = evaluate(state)
          log(step, eval_metrics)
          say(f"step {step}: " + ", ".join(
              f"{name} {np.nanmean(value):.4f}" for name, value in eval_metrics.items()))
        if save_now or stop:
          checkpoints.save(step, state)
        if stop:
          raise Interrupted(stop, step)
  finally:
    if progress is not None:
      progress.close()
    checkpoints.close()
    for replica_log in logs:
      replica_log.close()
  if not eval_metrics:  # resumed a finished run
    eval_metrics = evaluate(state)
  if config.attention_maps:
    params = hosts.fetch(state.params)
    if hosts.writer():
      from experiments import attention_maps  # matplotlib only when maps are asked for
      for index, replica in enumerate(replicas):
        attention_maps.write(model, jax.tree.map(lambda leaf: leaf[index], params), task,
                             config.attention_maps, os.path.join(workdir_lib.replica_dir(
                                 workdir, replica["name"]), "attention_maps"))
  final_probes = probe("final", state.params) if probes else {}
  columns = {key: [replica[key] for replica in replicas] for key in replicas[0]}
  diverged_at = hosts.fetch(state.diverged_at).tolist()
  return {**columns, **eval_metrics, **init_probes, **final_probes, "diverged_at": diverged_at,
          "num_classes": [task.num_classes] * len(replicas),
          "parameters": [parameter_count(state.params)] * len(replicas),
          "seconds": [time.perf_counter() - started] * len(replicas)}


def _diverged(state, replicas) -> dict:
  """{replica name: the step whose loss or gradient norm was not finite} (waits for the
  device)."""
  return {replica["name"]: int(at) for replica, at in
          zip(replicas, hosts.fetch(state.diverged_at)) if at}


def _check_diverged(state, replicas, reported, last_saved, say) -> set:
  """Says which replicas diverged since the last check (they stay frozen while the others
  train); raises NonFiniteError when all have. Returns the names of the diverged replicas."""
  bad = _diverged(state, replicas)
  advice = "Try a lower learning_rate, grad_clip_norm > 0, or compute_dtype='float32'."
  if len(bad) == len(replicas):
    raise NonFiniteError(
        f"non-finite loss or gradient norm at step {min(bad.values())} (replicas "
        f"{sorted(bad)}); the last good checkpoint is step {last_saved}. {advice}")
  for name in sorted(set(bad) - reported):
    say(f"replica {name} diverged at step {bad[name]} (non-finite loss or gradient norm): "
        f"frozen there, reported as NaN; the other replicas go on. {advice}")
  return set(bad)


def _prober(model, task, config):
  """prefix, params [R, ...] -> {prefix_<probe>: [R] list} on one test batch."""
  batch = next(input_pipeline.eval_batches(task.test, config.batch_size))
  probe_fn = jax.jit(over_replicas(lambda params: probes_lib.summary(
      model, params, batch["tokens"], batch["labels"], task.num_classes)))
  def probe(prefix, params):
    return {f"{prefix}_{name}": np.asarray(value).tolist()
            for name, value in hosts.fetch(probe_fn(params)).items()}
  return probe


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains and evaluates the one replica that ``config`` describes; returns its final eval
  metrics ({"eval_loss", "eval_accuracy"}, or "eval_nmse" for real targets)."""
  result = train(config, workdir, replicas_of(config))
  final = {name: values[0] for name, values in result.items() if name.startswith("eval_")}
  if hosts.writer():
    print("final: " + json.dumps({"step": config.num_train_steps, **final}))
    print(f"outputs in {workdir}: config.json, checkpoints/, and per replica in replicas/: "
          f"metrics.jsonl, TensorBoard events"
          + (", attention_maps/" if config.attention_maps else "")
          + f". Look at them with: tensorboard --logdir={workdir}")
  return final


def parameter_count(params) -> int:
  """The number of parameters of one replica, from a stacked [R, ...] parameter tree's shapes."""
  return sum(math.prod(leaf.shape[1:]) for leaf in jax.tree.leaves(params))


def run_command(main_function, *args) -> None:
  """Runs ``main_function(*args)``, turning the expected failures into one line and an exit
  status: a config error, a busy or full workdir, a non-finite loss (1), SIGTERM/SIGINT
  (128 + the signal, after the checkpoint). With several processes, an error that every process
  raised together (hosts.agree, the preemption sync point) ends them all with the same line;
  an error of this process alone (a bug, a collective whose peer died) ends it at once, with its
  traceback and a line, so that the others' collectives fail fast instead of waiting for it."""
  try:
    main_function(*args)
  except Exception as error:  # noqa: BLE001 -- each ends in one line below
    line, status = _ending(error)
    alone = jax.process_count() > 1 and not (hosts.agreed(error) or isinstance(error, Interrupted))
    if line is None and not alone:
      raise
    if line is None:
      traceback.print_exc()
      line = (f"process {jax.process_index()} stopped: {type(error).__name__}: "
              f"{hosts.first_line(error)}; if "
              "another process stopped first, its output says why.")
    print(line, file=sys.stderr, flush=True)
    if alone:
      sys.stdout.flush()
      os._exit(status)  # no shutdown barrier: the other processes may never reach it
    sys.exit(status)


def _ending(error: Exception) -> tuple[str | None, int]:
  """The line and exit status of an expected failure; (None, 1) for any other error."""
  if isinstance(error, Interrupted):
    return f"stopped by {error}", 128 + error.signum
  prefixes = ((config_check.ConfigError, "config error: "),
              (workdir_lib.WorkdirError, "workdir error: "),
              (NonFiniteError, "training stopped: "), (hosts.CoordinatorError, ""),
              (hosts.ProcessFailed, "stopped: "))
  for kind, prefix in prefixes:
    if isinstance(error, kind):
      return prefix + str(error), 1
  return None, 1


def main():
  from absl import flags, logging
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", "configs/default.py", "Path to a config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and figures.",
                      required=True)
  hosts.define_flags(flags)

  def run(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    run_command(lambda: (hosts.initialize_from(flags.FLAGS),
                         train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)))

  config_check.run_app(run)


if __name__ == "__main__":
  main()
