"""What the training commands set up in their own process before anything else runs.

``with_huge_pages`` re-executes the command once with GLIBC_TUNABLES=glibc.malloc.hugetlb=1
added, which makes glibc's malloc back large buffers with transparent huge pages; glibc reads
the setting only when a process starts, and other libcs ignore it. Why, and its effect on the
training step: docs/performance.md, "Huge pages".
"""

from __future__ import annotations

import os
import sys

HUGE_PAGES = "glibc.malloc.hugetlb=1"
# Set to 1 to keep the environment as it is (no re-execution).
KEEP_ENVIRONMENT = "ATTENTION_JAX_KEEP_ENVIRONMENT"


def with_huge_pages() -> None:
  """Re-executes this command (same pid, arguments and environment) with glibc's huge-page
  setting added, unless it is there already, or KEEP_ENVIRONMENT=1, or this is not Linux."""
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  if (not sys.platform.startswith("linux") or os.environ.get(KEEP_ENVIRONMENT) == "1"
      or "glibc.malloc.hugetlb" in tunables):
    return
  environment = dict(os.environ, GLIBC_TUNABLES=":".join(filter(None, (tunables, HUGE_PAGES))))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
