"""Ablation sweeps: vmapped seeds equal single runs, resume, failures recorded, reports, configs."""

import csv
import importlib
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from experiments import logbook, seeds, sweep, sweep_report, train
from test_train import ROOT, TINY, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def tiny_sweep(data_dir, variants, num_seeds=2):
  config = ml_collections.ConfigDict()
  config.train = tiny_config(data_dir)
  config.num_seeds = num_seeds
  config.vmap_seeds = True
  config.extra_evals = ml_collections.ConfigDict({"long": {"max_length": 16}})
  config.train.model.max_length = 16
  config.variants = variants
  return config


TWO_VARIANTS = (("sinusoidal", {"model": {"positional_encoding": "sinusoidal"}}),
                ("none", {"model": {"positional_encoding": "none"}}))


@pytest.fixture(scope="module")
def group(data_dir, tmp_path_factory):
  """Seeds 0 and 1 of the tiny config, trained together."""
  workdir = str(tmp_path_factory.mktemp("group"))
  return workdir, seeds.train_seeds(tiny_config(data_dir), workdir, 2)


def test_vmapped_seeds_equal_training_each_seed_alone(group, data_dir, tmp_path):
  workdir, together = group
  assert together["seed"] == [0, 1]
  for seed in (0, 1):
    alone_dir = str(tmp_path / f"alone{seed}")
    final = train.train_and_evaluate(tiny_config(data_dir, seed=seed), alone_dir)
    np.testing.assert_allclose(together["eval_loss"][seed], final["eval_loss"], rtol=1e-5)
    assert together["eval_accuracy"][seed] == final["eval_accuracy"]
    alone, grouped = logbook.read(alone_dir), logbook.read(seeds.seed_dir(workdir, seed))
    assert [line["step"] for line in grouped] == [line["step"] for line in alone]
    for a, b in zip(alone, grouped):
      assert set(b) == set(a) - {"learning_rate"}
      for name in b:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_interrupted_group_resumes_from_its_checkpoint(group, data_dir, tmp_path):
  workdir, uninterrupted = group
  seeds.train_seeds(tiny_config(data_dir, num_train_steps=4), str(tmp_path), 2)  # "killed"
  resumed = seeds.train_seeds(tiny_config(data_dir), str(tmp_path), 2)
  for name in ("eval_loss", "eval_accuracy", "final_entropy", "final_query_grad_norm"):
    np.testing.assert_allclose(resumed[name], uninterrupted[name], rtol=1e-5, err_msg=name)
  assert logbook.read(seeds.seed_dir(str(tmp_path), 1)) == logbook.read(
      seeds.seed_dir(workdir, 1))


def test_sweep_writes_tables_and_plots_then_skips_finished_variants(data_dir, tmp_path,
                                                                    monkeypatch):
  config = tiny_sweep(data_dir, TWO_VARIANTS)
  records = sweep.run_sweep(config, str(tmp_path))
  paths = sweep_report.write(records, str(tmp_path))
  with open(paths["csv"]) as f:
    table = list(csv.DictReader(f))
  assert [(row["variant"], row["seed"]) for row in table] == [
      ("sinusoidal", "0"), ("sinusoidal", "1"), ("none", "0"), ("none", "1")]
  for column in ("eval_accuracy", "eval_loss", "long_accuracy", "init_logit_variance",
                 "final_entropy", "init_query_grad_norm", "model.positional_encoding"):
    assert column in table[0]
  accuracies = [float(row["eval_accuracy"]) for row in table[:2]]
  markdown = open(paths["markdown"]).read()
  mean, std = np.mean(accuracies), np.std(accuracies, ddof=1)
  assert f"| sinusoidal | {mean:.3f} ± {std:.3f} |" in markdown
  for kind in ("final", "curves", "probes"):
    assert os.path.getsize(paths[kind]) > 5000

  def no_training(*args, **kwargs):
    raise AssertionError("a finished variant was trained again")
  monkeypatch.setattr(seeds, "train_seeds", no_training)
  again = sweep.run_sweep(config, str(tmp_path))
  assert again == records

  changed = tiny_sweep(data_dir, TWO_VARIANTS)
  changed.train.num_train_steps = 16  # finished variants must not be reused for another config
  with pytest.raises(sweep.config_check.ConfigError,
                     match="variant 'sinusoidal' .* different config \\(num_train_steps changed"):
    sweep.run_sweep(changed, str(tmp_path))
  more_seeds = tiny_sweep(data_dir, TWO_VARIANTS, num_seeds=3)
  with pytest.raises(sweep.config_check.ConfigError, match="num_seeds changed"):
    sweep.run_sweep(more_seeds, str(tmp_path))


def test_a_failing_variant_is_recorded_and_the_others_still_run(data_dir, tmp_path):
  broken = ("tiny_data", {"task_options": {"num_train": 8}})  # fewer examples than one batch
  config = tiny_sweep(data_dir, (broken, TWO_VARIANTS[1]), num_seeds=1)
  records = sweep.run_sweep(config, str(tmp_path))
  assert [record["status"] for record in records] == ["failed", "ok"]
  assert "batch_size=16 exceeds the 8 training examples" in records[0]["error"]
  assert os.path.exists(tmp_path / "variants" / "tiny_data" / "error.txt")
  markdown = sweep_report.markdown("t", records)
  assert "- tiny_data: ConfigError: batch_size=16 exceeds" in markdown
  with open(sweep_report.write(records, str(tmp_path))["csv"]) as f:
    assert [row["status"] for row in csv.DictReader(f)] == ["failed", "ok"]


def test_invalid_variant_is_refused_before_any_training(data_dir, tmp_path):
  config = tiny_sweep(data_dir, (("bad", {"model": {"num_heads": 3}}),))
  with pytest.raises(sweep.config_check.ConfigError, match="variant 'bad': model.num_heads=3"):
    sweep.run_sweep(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "variants")


@pytest.mark.parametrize("name", ["scaling", "heads", "positional"])
@pytest.mark.parametrize("mode", [None, "quick"])
def test_ablation_configs_are_valid(name, mode):
  module = importlib.import_module(f"configs.ablations.{name}")
  config = module.get_config(mode)
  sweep.check(config)
  assert config.num_seeds == (2 if mode == "quick" else 3)
  for _, overrides in config.variants:
    assert sweep.variant_config(config, overrides).model.num_heads > 0


def test_quick_sweep_from_the_command_line(data_dir, tmp_path):
  shrink = {f"train.{k}": v for k, v in TINY.items()}
  shrink.update({"train.data_dir": data_dir, "train.model.max_length": 64,
                 "train.num_train_steps": 4, "train.eval_every_steps": 2})
  command = [sys.executable, "-m", "experiments.sweep",
             "--config=configs/ablations/positional.py:quick", f"--workdir={tmp_path}",
             "--variants=rope"]
  command += [f"--config.{k}={v}" for k, v in shrink.items()]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "| rope |" in result.stdout and "long_accuracy" in result.stdout
  with open(tmp_path / "results.csv") as f:
    assert [row["variant"] for row in csv.DictReader(f)] == ["rope"] * 2
  again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  assert again.stdout.count("finished earlier, skipped") == 1


@pytest.mark.parametrize("flag, message", [
    ("--variants=heads_3", "no variants named ['heads_3']"),
    ("--config.train.model.num_layerz=2", "num_layerz"),
    ("--config.num_seeds=0", "num_seeds must be positive"),
])
def test_sweep_command_line_errors_are_one_line(flag, message, tmp_path):
  result = subprocess.run([sys.executable, "-m", "experiments.sweep",
                           "--config=configs/ablations/heads.py", f"--workdir={tmp_path}", flag],
                          cwd=ROOT, capture_output=True, text=True)
  assert result.returncode != 0
  assert message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
  assert not os.path.exists(tmp_path / "variants")


def test_a_trained_seed_loads_back_for_head_diagnostics(group, tmp_path):
  import functools
  import importlib.util
  import jax
  from experiments import trained
  workdir, result = group
  run = trained.load(workdir, seed_index=1)
  eval_fn = jax.jit(functools.partial(train.eval_step, model=run.model, config=run.config,
                                      num_classes=run.task.num_classes))
  metrics = train.evaluate(eval_fn, run.params, run.task.test, run.config.batch_size)
  assert metrics["eval_accuracy"] == result["eval_accuracy"][1]
  spec = importlib.util.spec_from_file_location(
      "head_diagnostics", os.path.join(ROOT, "scripts", "head_diagnostics.py"))
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  stats = script.diagnose(run, 32)
  layers, heads = run.config.model.num_layers, run.config.model.num_heads
  for name in script.COLUMNS:
    assert stats[name].shape == (layers, heads)
  assert np.all((stats["diagonal_max"] >= 0) & (stats["diagonal_max"] <= 1))
  assert script.table(stats).count("\n") == 2 + layers * heads
  script.heat_maps(stats, str(tmp_path / "heads.png"))
  assert os.path.getsize(tmp_path / "heads.png") > 5000
