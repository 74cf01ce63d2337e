"""Replicas and sweeps: vmapped seeds x hyperparameters equal single runs, on 1 and 8 devices; resume,
SIGTERM, failures recorded, reports, configs."""

import csv
import importlib
import os
import signal
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from experiments import input_pipeline, logbook, report_tables, steps, sweep, sweep_report, train
from experiments import interrupts, verdicts
from experiments import replicas as replicas_lib
from experiments import workdir as workdir_lib
from training_helpers import EIGHT_CPU_DEVICES, GRID, ROOT, TINY, tiny_config



def tiny_sweep(data_dir, variants, num_seeds=2):
  config = ml_collections.ConfigDict()
  config.train = tiny_config(data_dir)
  config.num_seeds = num_seeds
  config.vmap_replicas = True
  config.grid = ml_collections.ConfigDict()
  config.extra_evals = ml_collections.ConfigDict({"long": {"max_length": 16}})
  config.train.model.max_length = 16
  config.variants = variants
  return config


TWO_VARIANTS = (("sinusoidal", {"model": {"positional_encoding": "sinusoidal"}}),
                ("none", {"model": {"positional_encoding": "none"}}))


@pytest.fixture(scope="module")
def group(data_dir, tmp_path_factory):
  """Seeds 0 and 1 of the tiny config at two learning rates: four replicas trained together."""
  workdir = str(tmp_path_factory.mktemp("group"))
  config = tiny_config(data_dir)
  return workdir, train.train(config, workdir, replicas_lib.replicas_of(config, 2, GRID),
                              probes=True)


def test_vmapped_replicas_equal_training_each_alone(group, data_dir, tmp_path):
  workdir, together = group
  assert together["name"] == ["seed_0-learning_rate_0.001", "seed_1-learning_rate_0.001",
                              "seed_0-learning_rate_0.003", "seed_1-learning_rate_0.003"]
  assert together["learning_rate"] == [1e-3, 1e-3, 3e-3, 3e-3]
  for index, seed, rate in ((1, 1, 1e-3), (2, 0, 3e-3)):
    alone_dir = str(tmp_path / f"alone{index}")
    final = train.train_and_evaluate(tiny_config(data_dir, seed=seed, learning_rate=rate),
                                     alone_dir)
    np.testing.assert_allclose(together["eval_loss"][index], final["eval_loss"], rtol=1e-5)
    assert together["eval_accuracy"][index] == final["eval_accuracy"]
    alone, grouped = logbook.read(alone_dir), logbook.read(workdir, index)
    assert [line["step"] for line in grouped] == [line["step"] for line in alone]
    for a, b in zip(alone, grouped):
      assert set(b) == set(a)
      for name in b:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("size", [1, 2])
def test_programs_of_fewer_replicas_train_each_replica_as_one_program_does(group, data_dir,
                                                                          tmp_path, size):
  """The grouping of replicas into programs (one of each, or one per learning rate) changes
  the batched computation, not the run: each replica's result is the all-at-once program's up to
  float rounding."""
  _, together = group
  config = tiny_sweep(data_dir, ())
  config.grid = ml_collections.ConfigDict(GRID)
  config.replicas_per_program = size
  config.extra_evals = ml_collections.ConfigDict()
  grouped = sweep.train_variant(config, tiny_config(data_dir), str(tmp_path))
  assert grouped["name"] == together["name"]
  np.testing.assert_allclose(grouped["eval_loss"], together["eval_loss"], rtol=1e-5)
  kind = "alone" if size == 1 else "programs"
  assert len(os.listdir(tmp_path / kind)) == 4 // size
  assert len(set(grouped["seconds"])) == 1


def test_eight_simulated_devices_shard_the_replicas_and_follow_one_device(group, data_dir,
                                                                         tmp_path):
  workdir, _ = group
  code = ("import sys; import jax; from experiments import replicas, train;"
          "from tests.training_helpers import GRID, tiny_config;"
          "assert jax.device_count() == 8; config = tiny_config(sys.argv[1]);"
          "assert dict(replicas.device_mesh(4).shape) == {'replica': 4, 'data': 2, 'sequence': 1};"
          "train.train(config, sys.argv[2], replicas.replicas_of(config, 2, GRID))")
  subprocess.run([sys.executable, "-c", code, data_dir, str(tmp_path)], cwd=ROOT,
                 env={**os.environ, **EIGHT_CPU_DEVICES}, check=True, capture_output=True)
  for index in range(4):
    one, eight = logbook.read(workdir, index), logbook.read(str(tmp_path), index)
    assert [line["step"] for line in one] == [line["step"] for line in eight]
    for a, b in zip(one, eight):
      for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=2e-4, atol=1e-6, err_msg=name)


def test_a_sweep_with_a_grid_survives_sigterm_and_a_busy_workdir(group, data_dir, tmp_path,
                                                               monkeypatch):
  """One variant x GRID x 2 seeds as a sweep: refused while another process holds the workdir,
  stopped by SIGTERM at step 6 (checkpoint saved), then resumed to the group's exact numbers,
  with a row and a metrics log per (seed, learning rate)."""
  config = tiny_sweep(data_dir, (("base", {}),))
  config.extra_evals, config.train.model.max_length = ml_collections.ConfigDict(), 0
  config.grid = ml_collections.ConfigDict(GRID)
  with workdir_lib.owned(str(tmp_path)):
    with pytest.raises(workdir_lib.WorkdirError, match=f"in use by process {os.getpid()} "):
      sweep.run_sweep(config, str(tmp_path))

  batch = input_pipeline.TrainBatches.batch
  def terminated_at_step_6(self, step):
    if step == 5 and not os.path.exists(tmp_path / "sent"):
      (tmp_path / "sent").touch()
      os.kill(os.getpid(), signal.SIGTERM)
    return batch(self, step)
  monkeypatch.setattr(input_pipeline.TrainBatches, "batch", terminated_at_step_6)
  with pytest.raises(interrupts.Interrupted, match="SIGTERM at step 6: checkpoint saved"):
    sweep.run_sweep(config, str(tmp_path))
  variant = tmp_path / "variants" / "base"
  assert sorted(os.listdir(variant / "checkpoints")) == ["2", "4", "6"]
  assert not os.path.exists(variant / "result.json")

  (record,) = sweep.run_sweep(config, str(tmp_path))
  _, together = group
  assert record["metrics"]["name"] == together["name"]
  for name, values in together.items():
    if name not in ("name", "seconds"):
      np.testing.assert_allclose(record["metrics"][name], values, rtol=1e-6, err_msg=name)
  design = verdicts.Design.of_sweep(config, "accuracy")
  with open(sweep_report.write([record], str(tmp_path), design)["csv"]) as f:
    table = list(csv.DictReader(f))
  assert [(row["seed"], float(row["learning_rate"])) for row in table] == [
      ("0", 1e-3), ("1", 1e-3), ("0", 3e-3), ("1", 3e-3)]
  assert {row["baseline"] for row in table} == {"base"} and table[0]["commit"]
  report = open(tmp_path / "results.md").read()
  assert "| base lr=0.003 |" in report
  assert "Each variant at its chosen learning rate" in report
  assert "Largest attention logit" in report
  for figure in ("learning_rates.png", "max_attention_logits.png"):
    assert os.path.getsize(tmp_path / figure) > 5000
  for index in range(4):
    assert logbook.read(str(variant), index) == logbook.read(group[0], index)


def test_sweep_writes_tables_and_plots_then_skips_finished_variants(data_dir, tmp_path,
                                                                    monkeypatch):
  config = tiny_sweep(data_dir, TWO_VARIANTS)
  records = sweep.run_sweep(config, str(tmp_path))
  paths = sweep_report.write(records, str(tmp_path), verdicts.Design.of_sweep(config, "accuracy"))
  with open(paths["csv"]) as f:
    table = list(csv.DictReader(f))
  assert [(row["variant"], row["seed"]) for row in table] == [
      ("sinusoidal", "0"), ("sinusoidal", "1"), ("none", "0"), ("none", "1")]
  for column in ("eval_accuracy", "eval_loss", "long_accuracy", "init_logit_variance",
                 "final_entropy", "init_query_grad_norm", "model.positional_encoding"):
    assert column in table[0]
  accuracies = [float(row["eval_accuracy"]) for row in table[:2]]
  markdown = open(paths["markdown"]).read()
  assert f"| sinusoidal | {report_tables.mean_cell(accuracies, 'eval_accuracy')} |" in markdown
  assert "| none | sinusoidal | Test accuracy | 2 |" in markdown  # the declared comparison, paired by seed
  for kind in ("final", "curves", "probes"):
    assert os.path.getsize(paths[kind]) > 5000

  def no_training(*args, **kwargs):
    raise AssertionError("a finished variant was trained again")
  monkeypatch.setattr(train, "train", no_training)
  again = sweep.run_sweep(config, str(tmp_path))
  assert again == records

  changed = tiny_sweep(data_dir, TWO_VARIANTS)
  changed.train.num_train_steps = 16  # finished variants must not be reused for another config
  with pytest.raises(sweep.config_check.ConfigError,
                     match="variant 'sinusoidal' .* different config \\(num_train_steps changed"):
    sweep.run_sweep(changed, str(tmp_path))
  more_seeds = tiny_sweep(data_dir, TWO_VARIANTS, num_seeds=3)
  with pytest.raises(sweep.config_check.ConfigError, match="num_seeds or grid changed"):
    sweep.run_sweep(more_seeds, str(tmp_path))


def test_an_optimum_at_the_edge_of_the_grid_is_bracketed_within_the_budget(data_dir, tmp_path,
                                                                           capsys):
  """With two rates the chosen one is always an edge: bracket=1 trains the seeds at the next
  rate past it (the grid's own ratio) once, adds them to the record and result.json, and a
  second run trains nothing; with no budget left it says so and trains nothing."""
  config = tiny_sweep(data_dir, (("base", {}),))
  config.extra_evals = ml_collections.ConfigDict({"validation": {"seed": 1, "num_train": 1}})
  config.grid = ml_collections.ConfigDict(GRID)
  config.bracket, config.budget_minutes = 1, 30
  (record,) = sweep.run_sweep(config, str(tmp_path / "bracketed"))
  rates = sorted(set(record["metrics"]["learning_rate"]))
  assert len(rates) == 3 and (rates[1:] == [1e-3, 3e-3] or rates[:2] == [1e-3, 3e-3])
  added = (set(rates) - {1e-3, 3e-3}).pop()
  assert added == pytest.approx(1e-3 / 3, rel=1e-2) or added == pytest.approx(9e-3, rel=1e-2)
  assert len(record["metrics"]["seed"]) == 6 and record["metrics"]["seed"][4:] == [0, 1]
  assert workdir_lib.read_result(str(tmp_path / "bracketed" / "variants" / "base")) == record
  assert "to bracket it" in capsys.readouterr().out
  assert sweep.run_sweep(config, str(tmp_path / "bracketed")) == [record]
  assert "to bracket it" not in capsys.readouterr().out

  config.budget_minutes = 0
  (alone,) = sweep.run_sweep(config, str(tmp_path / "no_budget"))
  assert sorted(set(alone["metrics"]["learning_rate"])) == [1e-3, 3e-3]
  assert "no time left" in capsys.readouterr().out


def test_a_failing_variant_is_recorded_and_the_others_still_run(data_dir, tmp_path):
  broken = ("tiny_data", {"task_options": {"num_train": 8}})  # fewer examples than one batch
  config = tiny_sweep(data_dir, (broken, TWO_VARIANTS[1]), num_seeds=1)
  records = sweep.run_sweep(config, str(tmp_path))
  assert [record["status"] for record in records] == ["failed", "ok"]
  assert "batch_size=16 exceeds the 8 training examples" in records[0]["error"]
  assert os.path.exists(tmp_path / "variants" / "tiny_data" / "error.txt")
  paths = sweep_report.write(records, str(tmp_path), verdicts.Design.of_sweep(config, "accuracy"))
  markdown = open(paths["markdown"]).read()
  assert "- tiny_data: ConfigError: batch_size=16 exceeds" in markdown
  with open(paths["csv"]) as f:
    assert [row["status"] for row in csv.DictReader(f)] == ["failed", "ok"]


def test_invalid_variant_is_refused_before_any_training(data_dir, tmp_path):
  config = tiny_sweep(data_dir, (("bad", {"model": {"num_heads": 3}}),))
  with pytest.raises(sweep.config_check.ConfigError, match="variant 'bad': model.num_heads=3"):
    sweep.run_sweep(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "variants")


@pytest.mark.parametrize("name", ["scaling", "heads", "positional", "learning_rate",
                                  "attention_variants"])
@pytest.mark.parametrize("mode", [None, "quick"])
def test_ablation_configs_are_valid(name, mode):
  module = importlib.import_module(f"configs.ablations.{name}")
  config = module.get_config(mode)
  sweep.check(config)
  seeds = getattr(module, "NUM_SEEDS", 3)  # the re-read studies: enough seeds for their tests
  assert config.num_seeds == (2 if mode == "quick" else seeds)
  assert "validation" in config.extra_evals and config.baseline in dict(config.variants)
  for _, overrides in config.variants:
    assert sweep.variant_config(config, overrides).model.num_heads > 0


STUDY_CONFIGS = sorted(name[:-3] for name in os.listdir(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ablations"))
                       if name.endswith(".py") and name != "__init__.py")


@pytest.mark.parametrize("name", STUDY_CONFIGS)
def test_every_study_config_refuses_a_misspelt_mode_in_one_line(name):
  """A misspelt mode (``heads.py:quik``) must not start the full sweep: one line naming the
  modes the config has."""
  module = importlib.import_module(f"configs.ablations.{name}")
  with pytest.raises(ValueError, match=r"mode must be .*got 'quik'\.$") as error:
    module.get_config("quik")
  assert "\n" not in str(error.value)


def test_quick_sweep_from_the_command_line(data_dir, tmp_path):
  shrink = {f"train.{k}": v for k, v in TINY.items()}
  shrink.update({"train.data_dir": data_dir, "train.model.max_length": 64,
                 "train.num_train_steps": 4, "train.eval_every_steps": 2})
  shrink["train.model.max_length"] = 80  # the longest test set of the positional sweep
  command = [sys.executable, "-m", "experiments.sweep",
             "--config=configs/ablations/positional.py:quick", f"--workdir={tmp_path}",
             "--variants=even_pairs-rope"]
  command += [f"--config.{k}={v}" for k, v in shrink.items()]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "| even_pairs-rope |" in result.stdout
  assert "length_61_80_accuracy" in result.stdout
  with open(tmp_path / "results.csv") as f:
    assert [row["variant"] for row in csv.DictReader(f)] == ["even_pairs-rope"] * 2
  assert os.path.getsize(tmp_path / "accuracy_by_test_set.png") > 5000
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
  import jax
  from experiments import probe_reports, report_plots, trained
  workdir, result = group
  run = trained.load(workdir, replica=2)
  assert run.replica["name"] == "seed_0-learning_rate_0.003" and run.step == 8
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=run.model, compute_dtype=np.float32,
                                      num_classes=run.task.num_classes))
  metrics = steps.evaluate(eval_fn, run.params, input_pipeline.eval_batches(
      run.task.test, run.config.batch_size))
  assert metrics["eval_accuracy"] == result["eval_accuracy"][2]
  stats = probe_reports.head_diagnostics(run, 32)
  layers, heads = run.config.model.num_layers, run.config.model.num_heads
  for name in probe_reports.HEAD_MEASURES:
    assert stats[name].shape == (layers, heads)
  assert np.all((stats["diagonal_max"] >= 0) & (stats["diagonal_max"] <= 1))
  assert probe_reports.head_table(stats).count("\n") == 2 + layers * heads
  report_plots.per_head_maps(stats, str(tmp_path / "heads.png"))
  assert os.path.getsize(tmp_path / "heads.png") > 5000
