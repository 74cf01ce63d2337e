"""`pip install .` ships only the library, needing only jax, flax, chex and numpy (and what they
need); the experiment stack is the "experiments" extra. The example runs against the built wheel."""

import importlib.metadata
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENT_STACK = {"tensorflow-datasets", "ml-collections", "matplotlib", "absl-py",
                    "tensorboardx", "tqdm", "array-record"}
NOT_PULLED_IN = EXPERIMENT_STACK - {"absl-py"}  # chex itself needs absl-py


def _name(requirement: str) -> str:
  return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  """The wheel, built from a copy of what it is built from: the build writes build/ and
  *.egg-info beside its sources, and two builds in one tree (this fixture runs once per xdist
  worker that gets a test of the module) collide there."""
  out, checkout = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("checkout")
  shutil.copytree(ROOT / "attention_jax", checkout / "attention_jax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(ROOT / name, checkout / name)
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(out), str(checkout)], check=True, capture_output=True)
  (path,) = out.glob("attention_jax-*.whl")
  return path


def test_the_wheel_holds_the_library_and_declares_four_dependencies(wheel):
  with zipfile.ZipFile(wheel) as archive:
    packages = {name.split("/")[0] for name in archive.namelist()
                if not name.split("/")[0].endswith(".dist-info")}
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    lines = archive.read(metadata).decode().splitlines()
  assert packages == {"attention_jax"}
  with zipfile.ZipFile(wheel) as archive:  # subpackages too: one file per attention variant
    assert "attention_jax/variants/base.py" in archive.namelist()
  requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist")]
  plain = {_name(r) for r in requires if "extra ==" not in r}
  extra = {_name(r) for r in requires if 'extra == "experiments"' in r}
  assert plain == {"jax", "flax", "chex", "numpy"}
  assert EXPERIMENT_STACK <= extra


def test_what_the_four_pull_in_excludes_the_experiment_stack():
  """The transitive closure of jax, flax, chex and numpy over the installed distributions."""
  seen, todo = set(), ["jax", "flax", "chex", "numpy"]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for requirement in importlib.metadata.requires(name) or []:
      parsed = Requirement(requirement)
      if parsed.marker is None or parsed.marker.evaluate({"extra": ""}):
        todo.append(_name(requirement))
  assert not seen & NOT_PULLED_IN, seen & NOT_PULLED_IN


def test_the_reuse_example_runs_against_the_installed_wheel(wheel, tmp_path):
  with zipfile.ZipFile(wheel) as archive:
    archive.extractall(tmp_path / "site")
  result = subprocess.run(
      [sys.executable, str(ROOT / "examples" / "use_in_your_project.py")], cwd=tmp_path,
      env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
      capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "0. NNX tagger under nnx.jit: (2, 6, 5)" in result.stdout
  assert "equals its Linen twin with the moved weights: True" in result.stdout
  assert "1. vmapped attention: (4, 8, 32)" in result.stdout
  assert "3. attention weights [B, N, T, S]: (2, 4, 6, 6)" in result.stdout
