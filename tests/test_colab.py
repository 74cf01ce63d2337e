"""The Colab notebook's set-up (experiments/colab.py): the accelerator read from the machine, the
jax build chosen for it at the pinned version, the refusal when JAX does not run on it, and the CPU
install done for real in a new virtual environment."""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest
from packaging.requirements import Requirement

from experiments import colab

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("environ, devices, expected", [
    ({}, [], "cpu"),
    ({"COLAB_GPU": "0"}, [], "cpu"),
    ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, [], "tpu"),
    ({}, ["/dev/accel0", "/dev/accel1"], "tpu"),
    ({}, ["/dev/vfio/0"], "tpu"),
    ({"COLAB_GPU": "1"}, [], "gpu"),
    ({}, ["/dev/nvidia0"], "gpu"),
    ({"JAX_PLATFORMS": "cpu"}, ["/dev/nvidia0"], "cpu"),
    ({"JAX_PLATFORMS": "cuda,cpu"}, [], "gpu"),
])
def test_the_accelerator_is_read_from_the_environment_and_dev(environ, devices, expected):
  assert colab.accelerator_of(environ=environ, devices=devices) == expected


@pytest.mark.parametrize("driver, extra", [("535.104.05", "cuda12"), ("579.9", "cuda12"),
                                           ("580.65.06", "cuda13"), ("590.1", "cuda13")])
def test_the_cuda_build_follows_the_driver(driver, extra):
  assert colab.cuda_extra(driver) == extra


def _pins_by_packaging(python_version):
  """The jax pin requirements.txt gives ``python_version``, read with packaging's markers."""
  pins = []
  for line in (ROOT / "requirements.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    if not line or line.startswith("-"):
      continue
    requirement = Requirement(line)
    if requirement.name == "jax" and (requirement.marker is None or requirement.marker.evaluate(
        {"python_version": python_version})):
      pins.append(str(requirement.specifier).removeprefix("=="))
  return pins


@pytest.mark.parametrize("python_version", ["3.11", "3.12", "3.13"])
def test_the_jax_pin_is_the_one_requirements_txt_gives_that_python(python_version):
  (expected,) = _pins_by_packaging(python_version)
  version = tuple(int(p) for p in python_version.split("."))
  assert colab.pinned_jax((ROOT / "requirements.txt").read_text(), version) == expected


@pytest.mark.parametrize("accelerator, driver, extra", [
    ("tpu", None, "jax[tpu]"), ("gpu", "550.54.15", "jax[cuda12]"),
    ("gpu", "580.82.07", "jax[cuda13]"), ("cpu", None, None)])
def test_the_install_adds_the_accelerator_s_jax_at_the_pinned_version(accelerator, driver, extra):
  command = colab.install_command(accelerator, str(ROOT), driver_version=driver)
  # every requirement of requirements.txt but the notebook server's, and the package itself
  expected = set()
  for line in (ROOT / "requirements.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    if line and not line.startswith("-"):
      expected.add(Requirement(line).name.lower())
  given = {Requirement(arg).name.lower() for arg in command[command.index("-q") + 1:]
           if not arg.startswith(("-", ".", "jax["))}
  assert given == expected - {"ipykernel", "nbclient", "nbformat"}
  assert command[command.index("-e") + 1] == "."
  extras = [arg for arg in command if arg.startswith("jax[")]
  if extra is None:
    assert not extras  # requirements.txt's own CPU jax
  else:
    (pin,) = _pins_by_packaging("%d.%d" % sys.version_info[:2])
    assert extras == [f"{extra}=={pin}"]


def test_a_backend_other_than_the_accelerator_stops_in_one_line_naming_the_fix(monkeypatch):
  monkeypatch.setattr(colab, "nvidia_driver_version", lambda: "550.54.15")
  commands = []
  with pytest.raises(colab.SetupError) as error:
    colab.setup(str(ROOT), accelerator="gpu", backend=lambda python: "cpu",
                run=lambda command, **kw: commands.append(command))
  message = str(error.value)
  assert "\n" not in message and "GPU" in message and "'cpu'" in message
  assert "Restart session" in message
  (command,) = commands
  assert any(arg.startswith("jax[cuda12]==") for arg in command)
  # the same accelerator passes, without an install when install=False
  assert colab.setup(str(ROOT), install=False, accelerator="tpu", backend=lambda python: "tpu",
                     run=None) == "tpu"


def test_the_cpu_install_runs_for_real_in_a_new_environment(tmp_path):
  """A new venv (its packages: this one's, through a .pth file, so pip finds every pin installed
  and needs no network) gets requirements.txt installed by setup(), the package itself editable;
  afterwards attention_jax imports from another directory and JAX's backend is the CPU."""
  checkout = tmp_path / "checkout"
  for name in ("attention_jax", "examples"):
    shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE", "requirements.txt"):
    shutil.copy(ROOT / name, checkout / name)
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = str(venv / "bin" / "python")
  site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        capture_output=True, text=True, check=True).stdout.strip()
  pathlib.Path(site, "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAX_PLATFORMS")}
  accelerator = colab.setup(
      str(checkout), python=python, accelerator="cpu",
      pip_options=("--no-index", "--no-build-isolation"),
      run=lambda command, **kw: subprocess.run(command, env=env, **kw))
  assert accelerator == "cpu"
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  result = subprocess.run([python, "-c", "import attention_jax; print(attention_jax.__file__)"],
                          cwd=elsewhere, env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(checkout / "attention_jax" / "__init__.py")


@pytest.mark.parametrize("restarted", [False, True])
def test_the_install_cell_clones_once_and_always_changes_into_the_clone(tmp_path, restarted):
  """On a first run the cell clones the repository into ./attention-jax; after a restart the
  runtime starts again in the folder above the clone, where attention_jax may already import:
  the cell must not clone again, and must change into the clone and put it on sys.path either
  way (run in quick mode: no install)."""
  import json
  if not (ROOT / ".git").exists():
    pytest.skip("not a git checkout: nothing to clone from")
  notebook = json.loads((ROOT / "notebooks" / "colab_quickstart.ipynb").read_text())
  cell = "".join(next(c for c in notebook["cells"] if c["cell_type"] == "code")["source"])
  if restarted:
    (tmp_path / "attention-jax").symlink_to(ROOT)  # the clone made before the restart
    repository, clone = str(tmp_path / "no-such-repository"), ROOT  # a clone would fail
  else:
    repository, clone = f"file://{ROOT}", tmp_path / "attention-jax"
  script = cell + "\nprint('cwd', os.getcwd()); print('path', sys.path[0])\n"
  env = {**os.environ, "ATTENTION_JAX_QUICK": "1", "PYTHONPATH": "",
         "ATTENTION_JAX_REPOSITORY": repository}
  result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert "JAX runs on the runtime's accelerator: cpu." in lines
  assert f"cwd {clone}" in lines and f"path {clone}" in lines
