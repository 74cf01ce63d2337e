"""Where a result came from: the commit, the versions, the machine and the date, recorded by the
run that made it (each sweep variant's result.json, then every row of results.csv and the head of
results.md), so that a number on a page can be traced without asking anyone."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata

#: The fields, in the order results.csv and the report show them.
FIELDS = ("commit", "python", "jax", "flax", "optax", "machine", "date")


def _commit() -> str:
  """The checkout's commit (short), with "+changes" when tracked files differ from it;
  "unknown" outside a git checkout."""
  def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                          cwd=sys.path[0] or None).stdout.strip()
  try:
    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return (commit + ("+changes" if dirty else "")) if commit else "unknown"


def machine() -> str:
  """The accelerator JAX runs on, or the CPU's model name and its core count."""
  import jax  # noqa: PLC0415 -- the reports import this module without needing jax
  device = jax.devices()[0]
  if device.platform != "cpu":
    return f"{len(jax.devices())} x {device.device_kind}"
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return f"{model}, {os.cpu_count()} cores"


def collect() -> dict[str, str]:
  """The provenance of a run started now, as strings keyed by FIELDS."""
  def version(package):
    try:
      return metadata.version(package)
    except metadata.PackageNotFoundError:
      return "not installed"
  return {"commit": _commit(), "python": platform.python_version(), "jax": version("jax"),
          "flax": version("flax"), "optax": version("optax"), "machine": machine(),
          "date": datetime.date.today().isoformat()}


def benchmark(**settings) -> dict:
  """What a benchmark measured on and with: ``collect``'s fields (the date with the time), the
  command, the platform, the device kind, the CPU count, torch's version where it is imported,
  GLIBC_TUNABLES, and the benchmark's ``settings``."""
  import jax  # noqa: PLC0415 -- as in machine
  torch = sys.modules.get("torch")
  return {**collect(), "command": " ".join(["python"] + sys.argv),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "platform": platform.platform(), "device_kind": jax.devices()[0].device_kind,
          "cpus": os.cpu_count(), "torch": None if torch is None else torch.__version__,
          "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""), **settings}


def summary(rows) -> dict[str, str]:
  """One provenance from the per-variant ones of ``rows`` (dicts holding FIELDS): a field's
  value, or its distinct values joined by " / " where variants differ (a sweep resumed on
  another commit or machine); "not recorded" where no row has it.

  >>> summary([{"commit": "abc", "date": "2026-11-26"}, {"commit": "def", "date": "2026-11-26"}])
  {'commit': 'abc / def', 'python': 'not recorded', 'jax': 'not recorded', 'flax': 'not recorded', 'optax': 'not recorded', 'machine': 'not recorded', 'date': '2026-11-26'}
  """
  merged = {}
  for field in FIELDS:
    values = list(dict.fromkeys(part for row in rows if row.get(field)
                                for part in str(row[field]).split(" / ")))
    merged[field] = " / ".join(values) if values else "not recorded"
  return merged
