"""The training commands re-execute themselves once with glibc's huge-page setting."""

import os
import subprocess
import sys

import pytest

from training_helpers import ROOT

SHOW = ("import os; from experiments import launch; "
        "launch.with_huge_pages(); print(os.getpid(), os.environ.get('GLIBC_TUNABLES', ''))")


def _run(**environment):
  env = {key: value for key, value in os.environ.items()
         if key not in ("GLIBC_TUNABLES", "ATTENTION_JAX_KEEP_ENVIRONMENT")}
  result = subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, capture_output=True, text=True,
                          env={**env, **environment}, check=True)
  return result.stdout.strip().partition(" ")[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_the_setting_is_added_once_and_other_tunables_are_kept():
  assert _run() == "glibc.malloc.hugetlb=1"
  assert _run(GLIBC_TUNABLES="glibc.malloc.arena_max=2") == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  assert _run(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"  # a choice
  assert _run(ATTENTION_JAX_KEEP_ENVIRONMENT="1") == ""
