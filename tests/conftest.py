import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile

# Before jax is imported, and in the environment, so that the runs the tests start as
# subprocesses compute as the in-process ones do.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
# One persistent compilation cache for the whole test session, shared by the two xdist workers
# and every subprocess they start: the tiny training runs are mostly XLA compilation, and many
# tests compile the same programs. Only programs that take 0.3 s or more to compile are kept
# (writing every small eager op's executable cost more than it saved; docs/contributing.md,
# "Tests", has the timings). Its size limit turns on jax's file lock, so that no process reads an
# entry another is still writing. The key covers the program, the flags and the devices, so a
# cached executable is the one a fresh compilation would give. The process that owns the session
# (the xdist controller, or pytest itself) removes it at the end.
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_CACHE = os.path.join(tempfile.gettempdir(),
                      f"attention-jax-tests-{os.getppid() if _WORKER else os.getpid()}-jit-cache")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # unless the caller chose one
  os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE,
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.3",
                    JAX_COMPILATION_CACHE_MAX_SIZE=str(4 << 30))

# On a CPU-only machine, XLA compiles with LLVM's optimisations off: the tests' programs are tiny
# and mostly compilation, which this makes 20-30% faster (docs/contributing.md, "Tests"). The flags
# change how fast the compiled code runs and, at most, its rounding (LLVM may fuse multiply-adds
# differently), not its semantics. They go in the environment, so that the subprocesses the tests
# start compile as the tests do (runs compared bitwise are made under the same flags), and not
# where a GPU or TPU plugin is installed (there the tests time kernels).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
_ACCELERATOR_PLUGINS = ("jax-cuda", "jax_cuda", "libtpu", "jax-rocm", "jax_rocm")
if not any(dist.metadata["Name"].lower().startswith(_ACCELERATOR_PLUGINS)
           for dist in importlib.metadata.distributions()):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The tests check the mathematics against float64 references at float32 tolerances, so float32
# matrix products must be float32 on every backend. JAX's default on NVIDIA GPUs (and TPUs)
# rounds their inputs to TF32 (bfloat16 passes on TPU), whose errors are about 3e-4 relative;
# tests/test_gpu.py checks the default precision separately, at its own tolerance.
jax.config.update("jax_default_matmul_precision", "highest")  # if jax was imported before


def pytest_unconfigure(config):
  if not _WORKER:
    shutil.rmtree(_CACHE, ignore_errors=True)


def load_script(name: str):
  """scripts/<name>.py as a module (scripts/ is not a package the tests import from)."""
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def assert_close(actual, expected, rtol=1e-5, name=""):
  """max |actual - expected| <= rtol * max |expected| (relative to the array's scale)."""
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
  assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
  scale = max(np.max(np.abs(expected)), 1e-30) if expected.size else 1.0
  error = np.max(np.abs(actual - expected)) if expected.size else 0.0
  assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} * {scale:.3g}"


def redrawn(params, seed: int):
  """``params`` with every entry drawn again at unit-ish scale (0.5 N(0, 1)), so that no part of
  a model is too small to be seen (DCMHA's own initialisation makes its dynamic parts tiny)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [0.5 * jax.random.normal(k, leaf.shape)
                                   for k, leaf in zip(keys, leaves)])


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """A TFDS data_dir shared by every test that generates a task (each config once)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="session")
def reference_run(data_dir, tmp_path_factory):
  """One uninterrupted tiny run (workdir, final metrics), shared by the tests that compare with
  it. Tests copy it before changing anything in it."""
  from experiments import train
  from training_helpers import tiny_config
  workdir = str(tmp_path_factory.mktemp("reference"))
  final = train.train_and_evaluate(tiny_config(data_dir, attention_maps=1), workdir)
  return workdir, final


# The files whose tests start training runs and subprocesses, longest first: run before the
# quick ones, so that the two xdist workers finish together instead of one waiting on a long
# test collected last (alphabetical order put most of them at the end).
HEAVY_FIRST = ("test_multihost.py", "test_notebook.py", "test_train.py", "test_workdir.py",
               "test_sweep.py", "test_context_parallel.py", "test_packaging.py", "test_sharding.py",
               "test_readme.py", "test_superset.py", "test_benchmarks.py")


def pytest_configure(config):
  """With -n, the tests marked with one xdist_group run on one worker (xdist's loadgroup, which
  is load otherwise): tests/test_multihost.py's jobs share fixtures and run one at a time. The
  controller schedules by group; its workers, which parse the command line afresh, name the
  grouped tests by group (pytest_configure_node tells them)."""
  if getattr(config.option, "dist", "no") == "load":
    config.option.dist = "loadgroup"
  if getattr(config, "workerinput", {}).get("dist") == "loadgroup":
    config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  node.workerinput["dist"] = node.config.option.dist


def pytest_collection_modifyitems(items):
  rank = {name: index for index, name in enumerate(HEAVY_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))
