"""scripts/benchmark_attention.py runs end to end on a tiny shape and times what it was asked to."""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference
from conftest import assert_close, load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark(*arguments):
  return subprocess.run([sys.executable, "scripts/benchmark_attention.py", *arguments], cwd=ROOT,
                        capture_output=True, text=True)


def test_benchmark_attention_times_causal_methods_and_requested_blocks(tmp_path):
  output = tmp_path / "bench.json"
  result = _benchmark("--rounds", "2", "--shapes", "1,24,2,8", "--causal", "--blocks", "8x16",
                      "--methods", "default", "jax.nn", "flax.linen", "--json", str(output))
  assert result.returncode == 0, result.stderr
  report = json.loads(output.read_text())
  assert report["machine"]["causal"] is True
  timed = {(row["method"], row["backward"]): row for row in report["results"]}
  expected = {"default", "jax.nn", "flax.linen", "chunked:8x16"}
  assert set(timed) == {(method, backward) for method in expected for backward in (False, True)}
  for row in timed.values():
    assert row["median_s"] > 0 and "error" not in row
  assert timed[("jax.nn", False)]["time_vs_jax_nn"] == 1.0


def test_benchmark_attention_names_a_malformed_block_size():
  result = _benchmark("--blocks", "1024by4096")
  assert result.returncode != 0
  assert "'1024by4096' is not BQxBK" in result.stderr


def test_block_math_floor_computes_attention_and_its_gradients():
  benchmark = load_script("benchmark_attention")
  floor = functools.partial(benchmark.block_math_floor, block_q=8)
  rng = np.random.default_rng(0)
  query, key, value, cotangent = (rng.standard_normal((2, 24, 2, 8)).astype(np.float32)
                                  for _ in range(4))
  expected, _, cache = numpy_reference.attention(query, key, value)
  assert_close(floor(query, key, value), expected, 1e-5)
  gradients = jax.grad(lambda *qkv: jnp.sum(floor(*qkv) * cotangent), argnums=(0, 1, 2))
  for ours, reference in zip(gradients(query, key, value),
                             numpy_reference.attention_vjp(cache, cotangent)):
    assert_close(ours, reference, 1e-5)


def test_benchmark_structure_times_windows_and_measures_gqa_memory(tmp_path):
  output = tmp_path / "structure.json"
  result = subprocess.run([sys.executable, "scripts/benchmark_structure.py", "--rounds", "1",
                           "--length", "64", "--window", "4", "--gqa-length", "32", "--heads",
                           "4", "--group", "2", "--structure-length", "256", "--window-widths",
                           "8", "--documents", "1", "4", "--dense-length", "64", "--parts",
                           "window", "gqa", "structure", "blocks", "dense", "--json",
                           str(output)], cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(output.read_text())
  methods = {(row["part"], row["pass"], row["method"]) for row in rows}
  assert ("window", "fwd+bwd", "window (blocks skipped)") in methods
  assert {("gqa chunked", "fwd+bwd", name) for name in ("grouped queries",
                                                        "copied keys/values")} <= methods
  assert ("blocks: window (8, 8)", "fwd+bwd", "default (128x128)") in methods  # W = 17
  assert ("blocks: 4 documents", "fwd+bwd", "default (256x256)") in methods  # T = 256
  dense = {row["method"]: row for row in rows if row["part"] == "dense: key lengths"}
  assert dense["arguments"]["mask shape"] == "(1, 1, 1, 64)"  # [B, 1, 1, S]
  assert dense["mask_mod"]["mask shape"] == "(1, 4, 64, 64)"  # every index: [B, N, T, S]
  assert all(row["ms"] > 0 for row in rows)


def test_the_benchmarks_table_aligns_columns_and_shows_a_missing_value_as_a_dash(capsys):
  load_script("benchmark_structure").print_table(
      [{"method": "forward", "ms": 12.345, "temp MiB": None}, {"method": "jvp", "ms": 2.0}],
      {"ms": ".1f"})
  assert capsys.readouterr().out.splitlines() == ["method    ms temp MiB",
                                                  "forward 12.3        -",
                                                  "jvp      2.0        -"]


def test_benchmark_context_parallel_reports_memory_per_device_and_the_paper_ratio(tmp_path):
  output = tmp_path / "context_parallel.json"
  result = subprocess.run([sys.executable, "scripts/benchmark_context_parallel.py", "--devices",
                           "2", "--length", "256", "--heads", "2", "--kv-heads", "1",
                           "--head-dim", "8", "--rounds", "1", "--budget-mib", "3",
                           "--max-length", "4096", "--json", str(output)], cwd=ROOT,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(output.read_text())
  scaling = {(row["strategy"], row["devices"]): row for row in rows if row["part"] == "scaling"}
  assert set(scaling) == {("single device", 1), ("ring", 2), ("all_gather", 2)}
  # Sharding the sequence over two devices must shrink what each device holds.
  assert scaling[("ring", 2)]["mib_per_device"] < scaling[("single device", 1)]["mib_per_device"]
  budget = {row["strategy"]: row["longest_length"] for row in rows if row["part"] == "budget"}
  assert budget["ring"] >= budget["single device"]
  paper = [row for row in rows if row["part"] == "paper"]
  assert len(paper) == 2 and all(row["comm_to_compute"] > 0 for row in paper)


def test_benchmark_train_times_the_trainers_step_and_it_trains():
  """The runners step the trainer's compiled step (the loss falls on a repeated batch), and the
  rounds time every method that was asked for."""
  benchmark = load_script("benchmark_train")
  size = (4, 9, 16, 2, 1, 32)  # (B, T with CLS, D, N, L, mlp)
  config = benchmark.benchmark_config(size, "float32")
  tokens, labels = benchmark.random_batch(size[0], size[1])
  losses = []
  step = benchmark.jax_runner(config, tokens, labels, on_loss=losses.append)
  for _ in range(30):
    step()
  assert losses[-1] < losses[0]
  times = benchmark.measure(benchmark.runners(["attention_jax", "flax.linen"], size, "float32"),
                            rounds=2, seconds=0.01)
  assert set(times) == {"attention_jax", "flax.linen"}
  assert all(len(t) == 2 and min(t) > 0 for t in times.values())


def test_profile_train_measures_a_device_stream_s_busy_share_and_longest_gap():
  profile = load_script("profile_train")
  metadata = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream 7"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  kernels = [(0, 10), (5, 10), (20, 30), (100, 10)]  # (start, duration) in microseconds
  events = [{"ph": "X", "pid": 1, "tid": 7, "ts": t, "dur": d, "name": "k"} for t, d in kernels]
  events.append({"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 500, "name": "host"})
  streams = profile.device_streams(events, metadata)
  # Busy: [0, 15) + [20, 50) + [100, 110) = 55 us of a 110 us span; the longest gap 50 us.
  assert streams == {"/device:GPU:0 / Stream 7": {"busy": pytest.approx(0.5),
                                                  "longest_gap_ms": pytest.approx(0.05),
                                                  "kernels": 4}}


def test_profile_train_attributes_gpu_kernels_by_instruction_name_or_kind():
  profile = load_script("profile_train")
  metadata = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  events = [{"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": d, "name": name, "args": args}
            for name, d, args in (
                ("loop_add_fusion_3", 1e6, {}),  # the instruction loop_add_fusion.3
                ("sm90_kernel", 2e6, {"hlo_op": "custom-call.1"}),
                ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 3e6, {}),
                ("nvjet_sm90_tst_128x160", 4e6, {}), ("memcpy32_post", 5e6, {}),
                ("loop_convert_fusion", 6e6, {}))]
  events.append({"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 7e6, "name": "host"})
  parts = {"loop_add_fusion.3": "feed-forward, forward", "custom-call.1": "LayerNorm, forward"}
  assert profile.attribute(events, metadata, parts, steps=2) == {
      "feed-forward, forward": 0.5, "LayerNorm, forward": 1.0, "attention core (cuDNN)": 1.5,
      "matrix products (cuBLAS, GEMM fusions)": 2.0, "copies and fills": 2.5,
      "other XLA kernels": 3.0}


def test_profile_train_gives_products_and_the_chunked_loops_their_parts(monkeypatch):
  """A matrix product goes to the part whose parameter it reads, not to the LayerNorm or residual
  add that XLA fuses it with; the chunked kernel's loop bodies go to the attention core."""
  import attention_jax as aj
  monkeypatch.setattr(aj.blocks, "PAIR_BLOCK_BYTES", 2 * 4 * 16 * 16)  # 2 of 8 heads per step
  profile = load_script("profile_train")
  benchmark = profile.benchmark_train
  size = (4, 9, 16, 2, 1, 32)
  config = benchmark.benchmark_config(size, "float32")
  config.model.attention_impl = "chunked"
  step_fn, state, batch = benchmark.jax_step(config, *benchmark.random_batch(4, 9))
  text = step_fn.lower(state, batch).compile().as_text()
  parts = profile.instruction_parts(text, profile.weight_gradient_parts(state.params))

  loop_bodies = set(re.findall(r"body=%([\w.\-]+)", text))
  computation, with_product, in_loop, calling = None, set(), set(), {}
  for line in text.splitlines():
    header = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if header and line.rstrip().endswith("{"):
      computation = header.group(1)
    elif instruction := re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = ", line):
      with_product.update([computation] if " dot(" in line else [])
      calling[instruction.group(1)] = re.findall(r"calls=%([\w.\-]+)", line)
      in_loop.update([instruction.group(1)] if computation in loop_bodies else [])
  products = [name for name, called in calling.items()
              if name in parts and set(called) & with_product]
  assert products and not [name for name in products if parts[name].startswith("LayerNorm")]
  assert {parts[name] for name in products} >= {
      "attention projections, forward", "attention projections, backward",
      "feed-forward, forward", "feed-forward, backward"}
  loop_parts = {parts[name] for name in in_loop if name in parts}
  assert loop_parts and loop_parts <= {"attention core, forward", "attention core, backward"}


def test_benchmark_flex_times_block_skipping_and_plots_it(tmp_path):
  """Without torch (--skip-torch): ours at one length, and the document masks against full
  attention, with the figure."""
  output, figure = tmp_path / "flex.json", tmp_path / "sparsity.png"
  result = subprocess.run([sys.executable, "scripts/benchmark_flex.py", "--skip-torch",
                           "--lengths", "64", "--sparsity-length", "256", "--documents", "1",
                           "4", "--block", "64", "--rounds", "1", "--json", str(output),
                           "--plot", str(figure)], cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  report = json.loads(output.read_text())
  sparsity = {(row["pass"], row["documents"]): row for row in report["rows"]
              if row["part"] == "sparsity"}
  assert sparsity[("fwd", 4)]["blocks skipped"] == 0.75  # 4 documents of one block each
  assert sparsity[("fwd+bwd", 1)]["blocks skipped"] == 0.0
  assert report["machine"]["command"].startswith("python scripts/benchmark_flex.py")
  assert figure.stat().st_size > 0


def test_benchmark_fused_runs_every_case_and_ratio_in_the_interpreter(tmp_path):
  """The fused kernel's table in Pallas' interpreter (how this script is smoke-tested off a
  GPU): every case forward and forward+backward, the trained table in the backward only, the
  jvp of two cases, the ratios, and a tuning row; a malformed shape is refused in one line."""
  output = tmp_path / "fused.json"
  result = subprocess.run([sys.executable, "scripts/benchmark_fused.py", "--interpret",
                           "--shapes", "128,16", "--tune", "128,16", "--configs", "32:4:2",
                           "--heads", "2", "--rounds", "1", "--json", str(output)], cwd=ROOT,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(output.read_text())["rows"]
  timed = {(row["pass"], row["method"]) for row in rows if row["part"] == "table"}
  assert ("fwd+bwd", "fused causal T5 bias, trained") in timed
  assert ("fwd", "fused causal T5 bias, trained") not in timed
  assert ("fwd", "fused causal ALiBi, jvp") in timed
  assert ("fwd", "fused causal T5 bias, jvp") in timed
  # 8 fused cases and chunked, each pass (the trained table backward only), and two jvp rows
  assert len(timed) == 2 * 9 - 1 + 2
  assert "jvp / forward, causal ALiBi" in {row["ratio"] for row in rows if row["part"] == "ratio"}
  ratios = {row["ratio"] for row in rows if row["part"] == "ratio"}
  assert "trained table cost (T5 trained / constant)" in ratios and "dropout cost" in ratios
  assert any(row["part"] == "tune" and row["method"] == "fused 32:4:2" for row in rows)
  bad = subprocess.run([sys.executable, "scripts/benchmark_fused.py", "--shapes", "128x16"],
                       cwd=ROOT, capture_output=True, text=True)
  assert bad.returncode == 2 and "'128x16' is not T,H" in bad.stderr


def test_determinism_check_finds_the_step_deterministic_on_this_cpu():
  """scripts/determinism_check.py's worker: two runs of the trainer's step from the same state
  end with the same parameters, and the embedding's gradient shows as a scatter."""
  result = load_script("determinism_check").worker("default", "float32", "", steps=2)
  assert result["digests"][0] == result["digests"][1]
  assert result["losses"][0] == result["losses"][1]
  assert result["ops"]["scatter"] >= 1 and result["ops"]["cudnn calls"] == 0


def test_the_pallas_triton_peer_computes_scaled_causal_attention():
  """The benchmark's "pallas:triton" wrapper (scale and causality passed on), in Pallas'
  interpreter, against the NumPy reference."""
  methods = load_script("benchmark_attention").pallas_gpu_methods(is_causal=True, interpret=True)
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((1, 128, 2, 16)).astype(np.float32) for _ in range(3))
  expected = numpy_reference.attention(q, k, v, is_causal=True)[0]
  assert_close(methods["pallas:triton"](q, k, v), expected, 1e-5)
