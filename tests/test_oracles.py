"""Hand-set parameters solve each regression task through the library's encoder (near-zero NMSE),
so a run that fails to learn one never fails for want of expressive power."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_jax as aj
from experiments import input_pipeline, oracles, steps, tasks, train
from experiments import replicas as replicas_lib
from training_helpers import tiny_config

OPTIONS = {"num_train": 1, "num_test": 256}


def _nmse(model, params, split):
  eval_fn = jax.jit(lambda p, batch: steps.eval_step(p, batch, model=model,
                                                     compute_dtype=jnp.float32, num_classes=0))
  return steps.evaluate(eval_fn, params, input_pipeline.eval_batches(split, 64))["eval_nmse"]


def _model(data_dir, task_name, options, **model):
  """The trainer's model of ``task_name`` with ``model`` overrides, its task and initial params."""
  config = tiny_config(data_dir, task=task_name, **{f"model.{k}": v for k, v in model.items()})
  config.task_options = {**options, **OPTIONS}
  task, net, _, _ = train.setup(config, replicas_lib.replicas_of(config))
  params = net.init(jax.random.key(0), task.test.tokens[:1])["params"]
  return task, net, params


@pytest.mark.parametrize("num_layers, num_heads, head_dim", [(1, 1, 16), (2, 4, 16)])
def test_farthest_point_one_full_rank_head(num_layers, num_heads, head_dim, data_dir):
  """Amsel et al.'s head (W_Q = beta I, W_K = -I, W_V W_O = I) in the encoder at d_model 48:
  d_model 16, the sweep's width, has no room beside the inputs for the answer (see below)."""
  task, model, params = _model(data_dir, "farthest_point", {}, d_model=48, num_layers=num_layers,
                               num_heads=num_heads, head_dim=head_dim,
                               positional_encoding="none")
  assert _nmse(model, params, task.test) > 0.5  # untrained
  assert _nmse(model, oracles.farthest_point(model, params), task.test) < 1e-3


def test_farthest_point_through_the_attention_layer_at_the_sweeps_width(data_dir):
  """At d_model = d = 16 the oracle goes through MultiHeadAttention and a linear read-out (the
  identity): one head of d_k 16 with W_Q = beta I, W_K = -I, W_V = W_O = I."""
  task = tasks.load_task("farthest_point", OPTIONS, data_dir)
  layer = aj.MultiHeadAttention(num_heads=1)
  x = jnp.asarray(task.test.tokens)  # [B, N, d]
  params = jax.tree.map(jnp.zeros_like, layer.init(jax.random.key(0), x[:1])["params"])
  eye = jnp.eye(16)[:, None, :]  # [d, 1, d_k]
  params["query"]["kernel"] = 1e4 * jnp.sqrt(16.0) * eye
  params["key"]["kernel"], params["value"]["kernel"] = -eye, eye
  params["out"]["kernel"] = jnp.eye(16)[None]  # [1, d_k, d]
  predicted = np.asarray(layer.apply({"params": params}, x), np.float64)
  targets = task.test.labels.astype(np.float64)
  nmse = np.mean((predicted - targets) ** 2) / np.mean(np.var(targets.reshape(-1, 16), axis=0))
  assert nmse < 1e-3


@pytest.mark.parametrize("retrievals, num_heads, head_dim", [(2, 2, 0), (4, 4, 0), (8, 8, 0),
                                                             (4, 16, 0), (4, 4, 32)])
def test_multi_retrieval_a_head_per_retrieval(retrievals, num_heads, head_dim, data_dir):
  """Yu et al.'s construction at the sweep's width (d_model 32), with h = D heads of the standard
  split or a fixed head size, and with more heads than D."""
  options = {"num_retrievals": retrievals}
  task, model, params = _model(data_dir, "multi_retrieval", options, d_model=32,
                               num_layers=2, num_heads=num_heads, head_dim=head_dim,
                               positional_encoding="none", pooling="cls")
  assert _nmse(model, params, task.test) > 0.5
  assert _nmse(model, oracles.multi_retrieval(model, params, options), task.test) < 1e-3
  if num_heads < 8:
    with pytest.raises(ValueError, match="a head per retrieval: num_heads >= 8"):
      oracles.multi_retrieval(model, params, {"num_retrievals": 8})


def test_sparse_average_one_head_spreads_over_the_named_positions(data_dir):
  options = {"length": 16, "num_selected": 2, "value_dim": 8}
  task, model, params = _model(data_dir, "sparse_average", options, d_model=64, num_layers=1,
                               num_heads=1, positional_encoding="none")
  assert _nmse(model, params, task.test) > 0.5
  assert _nmse(model, oracles.sparse_average(model, params, options), task.test) < 1e-3


def test_an_oracle_without_room_says_how_wide_the_model_must_be():
  with pytest.raises(ValueError, match="needs d_model >= 33, got 16"):
    oracles.basis(16, 32)
  directions = oracles.basis(33, 32)
  np.testing.assert_allclose(directions @ directions.T, np.eye(32), atol=1e-12)
  np.testing.assert_allclose(directions.mean(axis=1), 0.0, atol=1e-12)


def _started(data_dir, noise, beta=30.0, d_model=48, seeds=2):
  """The trainer's step-0 parameters of farthest_point with init='oracle' (one per seed)."""
  config = tiny_config(data_dir, task="farthest_point", init="oracle", init_noise=noise,
                       init_beta=beta, **{"model.d_model": d_model, "model.num_heads": 1,
                                          "model.num_layers": 1,
                                          "model.positional_encoding": "none"})
  config.task_options = {**OPTIONS}
  replicas = replicas_lib.replicas_of(config, seeds)
  task, model, _, init = train.setup(config, replicas)
  state = init()
  return task, model, [jax.tree.map(lambda x, r=r: x[r], state.params) for r in range(seeds)]


def test_a_run_can_start_at_the_oracle_plus_noise_times_its_random_initialisation(data_dir):
  task, model, (first, second) = _started(data_dir, noise=0.0)
  direct = oracles.farthest_point(model, model.init(jax.random.key(0),
                                                    task.test.tokens[:1])["params"], beta=30.0)
  jax.tree.map(np.testing.assert_array_equal, first, jax.tree.map(np.float32, direct))
  jax.tree.map(np.testing.assert_array_equal, first, second)  # no noise: every seed the same
  assert _nmse(model, first, task.test) < 0.1  # beta 30: sharp enough to be near the answer
  _, _, noisy = _started(data_dir, noise=0.1)
  random = [model.init(jax.random.split(jax.random.PRNGKey(seed))[0], steps.example_inputs(
      model.config, task.max_length))["params"] for seed in (0, 1)]
  for params, init in zip(noisy, random):  # anchor + 0.1 x the seed's own random draw
    jax.tree.map(lambda p, a, r: np.testing.assert_allclose(p, a + 0.1 * r, atol=1e-6),
                 params, first, init)


def test_an_oracle_start_the_model_cannot_hold_is_refused_in_one_line(data_dir):
  with pytest.raises(train.config_check.ConfigError,
                     match="init='oracle': the oracle needs d_model >= 33, got 16"):
    _started(data_dir, noise=0.1, d_model=16)
  config = tiny_config(data_dir, init="oracle")  # the default task has no oracle
  with pytest.raises(train.config_check.ConfigError, match="needs a task with a hand-set"):
    train.config_check.validate(config)
