"""The Colab notebook's set-up: install the project's pinned stack with the jax build that matches
the runtime's accelerator, then check that JAX really runs on that accelerator.

The notebook's first cell clones the repository (or finds the clone from before a restart),
changes into it and calls :func:`setup`. This module imports only the standard library: it runs
before anything is installed.

Example (the accelerator is read from the environment and ``/dev``; nothing is installed here):

>>> accelerator_of(environ={}, devices=[])
'cpu'
>>> accelerator_of(environ={"COLAB_TPU_ADDR": "10.0.0.2:8470"}, devices=[])
'tpu'
>>> cuda_extra("550.54.15"), cuda_extra("580.82.07")
('cuda12', 'cuda13')
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

# The oldest NVIDIA driver (Linux) that runs CUDA 13; older drivers get jax's CUDA 12 build.
CUDA13_DRIVER = 580


class SetupError(RuntimeError):
  """The install did not give JAX the runtime's accelerator; the message says what to do."""


def accelerator_of(environ=None, devices=None) -> str:
  """'tpu', 'gpu' or 'cpu': the accelerator this machine has, read without importing jax (whose
  preinstalled build may not match it), or the platform ``JAX_PLATFORMS`` names. ``environ`` and
  ``devices`` (paths under /dev) default to this machine's."""
  environ = os.environ if environ is None else environ
  if environ.get("JAX_PLATFORMS"):  # the platform asked for by name, e.g. "cpu" or "cuda,cpu"
    first = environ["JAX_PLATFORMS"].split(",")[0].strip()
    return {"cuda": "gpu", "rocm": "gpu"}.get(first, first)
  if devices is None:
    devices = glob.glob("/dev/accel[0-9]*") + glob.glob("/dev/vfio/[0-9]*") + glob.glob(
        "/dev/nvidia[0-9]*")
  names = [os.path.basename(path) for path in devices]
  if environ.get("COLAB_TPU_ADDR") or environ.get("TPU_ACCELERATOR_TYPE") or any(
      re.fullmatch(r"accel\d+", name) or "/vfio/" in path for name, path in zip(names, devices)):
    return "tpu"
  if environ.get("COLAB_GPU", "0") not in ("", "0") or any(
      re.fullmatch(r"nvidia\d+", name) for name in names):
    return "gpu"
  return "cpu"


def nvidia_driver_version() -> str:
  """The NVIDIA driver's version as nvidia-smi reports it, e.g. '550.54.15'."""
  result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True)
  return result.stdout.split()[0]


def cuda_extra(driver_version: str) -> str:
  """jax's CUDA extra for an NVIDIA driver: 'cuda13' from driver 580 on, else 'cuda12'."""
  return "cuda13" if int(driver_version.split(".")[0]) >= CUDA13_DRIVER else "cuda12"


def pinned_jax(requirements: str, python_version: tuple[int, int]) -> str:
  """The jax version requirements.txt pins for ``python_version`` (pins are per Python version).

  >>> pinned_jax('jax==0.10.2; python_version < "3.12"\\njax==0.12.0.1; python_version >= "3.12"',
  ...            (3, 12))
  '0.12.0.1'
  """
  for line in requirements.splitlines():
    match = re.fullmatch(r"\s*jax==([^;\s]+)\s*(?:;\s*python_version\s*([<>=!]+)\s*\"([\d.]+)\")?"
                         r"\s*(?:#.*)?", line)
    if not match:
      continue
    version, operator, bound = match.groups()
    if operator is None:
      return version
    bound = tuple(int(part) for part in bound.split("."))
    if {"<": python_version < bound, "<=": python_version <= bound, ">": python_version > bound,
        ">=": python_version >= bound, "==": python_version == bound}[operator]:
      return version
  raise SetupError(f"requirements.txt pins no jax for Python {python_version[0]}."
                   f"{python_version[1]}; use a runtime with Python 3.11 or 3.12.")


# What requirements.txt pins only to execute the notebook in the tests: the notebook server's own
# packages, which a Colab runtime brings in the versions its front end needs.
NOT_ON_COLAB = ("ipykernel", "nbclient", "nbformat")


def requirement_lines(requirements: str) -> list[str]:
  """requirements.txt's requirements as pip arguments, comments and NOT_ON_COLAB left out.

  >>> requirement_lines('jax==0.10.2; python_version < "3.12"  # pinned\\nipykernel==7.4.0\\n-e .')
  ['jax==0.10.2; python_version < "3.12"', '-e', '.']
  """
  arguments = []
  for line in requirements.splitlines():
    line = line.split(" #")[0].strip()
    if not line or line.startswith("#"):
      continue
    if re.split(r"[<>=!~;\[\s]", line)[0].lower() in NOT_ON_COLAB:
      continue
    arguments += line.split(None, 1) if line.startswith("-") else [line]
  return arguments


def install_command(accelerator: str, checkout: str, *, python: str = sys.executable,
                    driver_version: str | None = None, pip_options=()) -> list[str]:
  """The pip command, run in ``checkout``: requirements.txt (every pin, and the package itself,
  editable; not the notebook server's packages, NOT_ON_COLAB) plus the jax build for
  ``accelerator`` at the pinned version (nothing more on a CPU)."""
  with open(os.path.join(checkout, "requirements.txt")) as file:
    requirements = file.read()
  command = [python, "-m", "pip", "install", "-q", *pip_options,
             *requirement_lines(requirements)]
  if accelerator == "cpu":
    return command
  version = pinned_jax(requirements, python_version_of(python))
  extra = "tpu" if accelerator == "tpu" else cuda_extra(driver_version or nvidia_driver_version())
  return command + [f"jax[{extra}]=={version}"]


def python_version_of(python: str) -> tuple[int, int]:
  if python == sys.executable:
    return sys.version_info[:2]
  out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                       capture_output=True, text=True, check=True).stdout
  major, minor = out.split()
  return int(major), int(minor)


def backend_of(python: str = sys.executable) -> str:
  """jax.default_backend() in a new process of ``python``: what was installed, not what this
  process may have imported before the install."""
  result = subprocess.run([python, "-c", "import jax; print(jax.default_backend())"],
                          capture_output=True, text=True)
  return result.stdout.strip().splitlines()[-1] if result.returncode == 0 else "none"


def check_backend(accelerator: str, backend: str) -> None:
  """Raises SetupError, in one line naming the fix, unless JAX's backend is the accelerator."""
  if backend != accelerator:
    raise SetupError(
        f"this runtime has a {accelerator.upper()} but JAX runs on {backend!r}: choose Runtime > "
        f"Restart session, then run this cell again (it reinstalls jax for the {accelerator.upper()}"
        "); if that fails, Runtime > Disconnect and delete runtime and start again.")


def setup(checkout: str = ".", *, install: bool = True, python: str = sys.executable,
          accelerator: str | None = None, pip_options=(), backend=backend_of,
          run=subprocess.run) -> str:
  """Installs the project for this runtime's accelerator (unless ``install`` is False) and checks
  that JAX runs on it. Returns the accelerator. Safe to call again after a restart."""
  accelerator = accelerator or accelerator_of()
  if install:
    command = install_command(accelerator, checkout, python=python, pip_options=pip_options)
    print(f"installing requirements.txt{' and ' + command[-1] if accelerator != 'cpu' else ''}")
    run(command, check=True, cwd=checkout)
  found = backend(python)
  check_backend(accelerator, found)
  print(f"JAX runs on the runtime's accelerator: {found}.")
  return accelerator
