"""W_Q's learning-rate scale and the SGD-with-momentum choice of experiments/optim.py, against
optax.multi_transform and a hand-written momentum recursion."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from experiments import optim


def _config(**options):
  return ml_collections.ConfigDict({"grad_clip_norm": 0.0, **options,
                                    "model": {"head_dim": 16, "d_model": 64, "num_heads": 4}})


def _params(key=0):
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(key), 4)
  return {"layer": {"query": {"kernel": jax.random.normal(k1, (4, 2, 3)),
                              "bias": jax.random.normal(k4, (2, 3))},
                    "key": {"kernel": jax.random.normal(k2, (4, 2, 3))},
                    "out": {"bias": jax.random.normal(k3, (4,))}}}


def _run(tx, params, steps=3, rate=1e-2):
  state = tx.init(params)
  for step in range(steps):
    if hasattr(state, "hyperparams"):
      state.hyperparams["learning_rate"] = jnp.asarray(rate)
      state.hyperparams["weight_decay"] = jnp.asarray(0.0)
    grads = jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_adamw_query_rate_times_inv_sqrt_dk_matches_multi_transform():
  params = _params()
  ours = _run(optim.optimizer(_config(query_lr_scale="inv_sqrt")), params)
  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "query" if "query" in str(path) else "rest", params)
  reference = optax.multi_transform({"query": optax.adamw(1e-2 / 4.0, weight_decay=0.0),
                                     "rest": optax.adamw(1e-2, weight_decay=0.0)}, labels)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               ours, _run(reference, params))


def test_without_the_options_it_is_plain_adamw():
  params = _params(1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               _run(optim.optimizer(_config()), params),
               _run(optax.adamw(1e-2, weight_decay=0.0), params))


def test_sgd_with_momentum_follows_the_heavy_ball_recursion_with_the_query_factor():
  params = _params(2)
  ours = _run(optim.optimizer(_config(optimizer="sgd", momentum=0.9, query_lr_scale=0.5)), params)
  expected = {}
  leaves = (("query", "kernel", 0.5), ("query", "bias", 0.5), ("key", "kernel", 1.0))
  for name, leaf, factor in leaves:
    p = np.asarray(params["layer"][name][leaf], np.float64)
    velocity = np.zeros_like(p)
    for step in range(3):
      velocity = np.sin(p * (step + 1)) + 0.9 * velocity  # optax.trace: g + momentum * v
      p = p - 1e-2 * factor * velocity
    expected[name, leaf] = p
  for name, leaf, _ in leaves:
    np.testing.assert_allclose(ours["layer"][name][leaf], expected[name, leaf], rtol=1e-5,
                               atol=1e-6)


def test_a_fused_qkv_kernel_and_bias_scale_only_their_query_slot():
  updates = {"qkv": {"kernel": jnp.ones((2, 3, 1, 2)), "bias": jnp.ones((3, 1, 2))},
             "out": {"bias": jnp.ones((2,))}}
  tx = optim.scale_query_updates(0.25)
  scaled, _ = tx.update(updates, tx.init(updates))
  np.testing.assert_array_equal(scaled["qkv"]["kernel"][0, :, 0, 0], [0.25, 1.0, 1.0])
  np.testing.assert_array_equal(scaled["qkv"]["bias"][:, 0, 0], [0.25, 1.0, 1.0])
  np.testing.assert_array_equal(scaled["out"]["bias"], [1.0, 1.0])


def test_an_unknown_optimizer_or_a_bad_factor_is_a_one_line_error():
  with pytest.raises(ValueError, match="optimizer must be one of"):
    optim.optimizer(_config(optimizer="lion"))
  with pytest.raises(ValueError, match="query_lr_scale must be"):
    optim.optimizer(_config(query_lr_scale=-1.0))


@pytest.mark.parametrize("mode", ["adam", "sgd_dk64", "sgd_unscaled", "mup_dk256"])
def test_each_mode_of_the_study_is_valid_and_powered_and_its_controls_reparametrise_w_q(mode):
  from configs.ablations import scale_optimiser
  from experiments import findings, sweep, verdicts
  config = scale_optimiser.get_config(mode)
  sweep.check(config)
  assert verdicts.Design.of_sweep(config, "accuracy").refusal(config.num_seeds) is None
  assert findings.refusal(findings.declaration_of(config.predictions), config.num_seeds) is None
  overrides = dict(config.variants)
  for name, value in overrides.items():
    d_k = value["model"]["head_dim"]
    expected = {"none_qlr_half": d_k ** -0.5, "none_qlr_full": 1.0 / d_k,
                "inv_sqrt_qup_half": d_k ** 0.5, "inv_sqrt_qup_full": d_k}.get(
        name.split("_", 1)[1], 1.0)
    assert value["query_lr_scale"] == pytest.approx(expected)
  assert config.train.optimizer == ("sgd" if mode.startswith("sgd") else "adamw")


@pytest.mark.parametrize("split", ["mup_dk256", "sgd_unscaled_dk64"])
def test_the_rate_splits_of_a_d_k_train_its_whole_grid_once_and_declare_one_design(split):
  from configs.ablations import scale_optimiser
  from experiments import verdicts
  whole = scale_optimiser.get_config(split)
  parts = [scale_optimiser.get_config(f"{split}_lr{rate}")
           for rate in scale_optimiser.RATE_SPLITS[split]]
  assert sorted(r for part in parts for r in part.grid.learning_rate) == sorted(
      whole.grid.learning_rate)
  assert {verdicts.Design.of_sweep(c, "accuracy") for c in parts} == {
      verdicts.Design.of_sweep(whole, "accuracy")}
  assert all(part.variants == whole.variants and part.bracket == 0 for part in parts)


def _trained_arms(mode, arms, steps=5):
  """{arm: its parameters after ``steps`` of the sweep's own compiled step, from seed 0 at the
  design's highest rate with no warmup, on one batch of random tokens}."""
  from configs.ablations import scale_optimiser
  from experiments import train
  sweep_config = scale_optimiser.get_config(mode)
  variants = dict(sweep_config.variants)
  trained = {}
  for arm in arms:
    config = sweep_config.train.copy_and_resolve_references()
    config.task_options.num_train, config.task_options.num_test = 64, 32  # one batch is used
    overrides = variants[f"dk16_{arm}"]
    config.update_from_flattened_dict({"query_lr_scale": overrides["query_lr_scale"], **{
        f"model.{k}": v for k, v in overrides["model"].items()}})
    replica = {"seed": 0, "learning_rate": max(sweep_config.grid.learning_rate),
               "weight_decay": config.weight_decay, "warmup_steps": 0.0}
    task, model, tx, init = train.setup(config, [replica])
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 16, task.max_length), 1,
                                task.vocab_size)
    batch = {"tokens": tokens, "labels": tokens % task.num_classes}
    step, state = train.train_step_fn(config, model, tx, task.num_classes), init()
    for _ in range(steps):
      state, _ = step(state, batch)
    trained[arm] = jax.tree.map(lambda x: np.asarray(x[0], np.float64), state.params)
  return trained


def test_under_sgd_the_scaled_arm_with_w_q_started_and_rated_up_is_the_unscaled_model():
  """sgd_unscaled's exact control: q.k / sqrt(d_k) with W_Q (kernel and bias) initialised
  x d_k^1/2 and its rate x d_k, weight decay 0, holds d_k^1/2 times the unscaled model's W_Q and
  its other parameters after training; Adam's factor (rate x d_k^1/2) drifts from it."""
  from configs.ablations import scale_optimiser
  assert scale_optimiser.get_config("sgd_unscaled_dk16").train.weight_decay == 0.0
  trained = _trained_arms("sgd_unscaled_dk16", ("none", "inv_sqrt_qup_full", "inv_sqrt_qup_half"))
  up = 16 ** 0.5

  def gap(arm):
    """The largest difference from the unscaled model's parameters, W_Q's read / d_k^1/2."""
    return max(jax.tree.leaves(jax.tree_util.tree_map_with_path(
        lambda path, a, b: np.abs(a / (up if "'query'" in jax.tree_util.keystr(path) else 1.0)
                                  - b).max(), trained[arm], trained["none"])))

  assert gap("inv_sqrt_qup_full") < 1e-5
  assert gap("inv_sqrt_qup_half") > 100 * max(gap("inv_sqrt_qup_full"), 1e-6)
