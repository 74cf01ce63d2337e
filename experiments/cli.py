"""How every command ends: ``run_command`` turns the expected failures of a command
(experiments.train's and experiments.sweep's ``main``) into one line and an exit status.
--distributed and its coordinator flags come from experiments/hosts.py.
"""

from __future__ import annotations

import os
import sys
import traceback

import jax

from experiments import config_check
from experiments import hosts
from experiments import interrupts
from experiments import steps as steps_lib
from experiments import workdir as workdir_lib


def run_command(main_function, *args) -> None:
  """Runs ``main_function(*args)``, turning the expected failures into one line and an exit
  status: a config error, a busy or full workdir, a non-finite loss (1), SIGTERM/SIGINT
  (128 + the signal, after the checkpoint). With several processes, an error that every process
  raised together (hosts.agree, the preemption sync point) ends them all with the same line;
  an error of this process alone (a bug, a collective whose peer died) ends it at once, with its
  traceback and a line, so that the others' collectives fail fast instead of waiting for it."""
  try:
    main_function(*args)
  except Exception as error:  # noqa: BLE001 -- each ends in one line below
    line, status = _ending(error)
    alone = jax.process_count() > 1 and not (hosts.agreed(error)
                                             or isinstance(error, interrupts.Interrupted))
    if line is None and not alone:
      raise
    if line is None:
      traceback.print_exc()
      line = (f"process {jax.process_index()} stopped: {type(error).__name__}: "
              f"{hosts.first_line(error)}; if "
              "another process stopped first, its output says why.")
    print(line, file=sys.stderr, flush=True)
    if alone:
      sys.stdout.flush()
      os._exit(status)  # no shutdown barrier: the other processes may never reach it
    sys.exit(status)


def _ending(error: Exception) -> tuple[str | None, int]:
  """The line and exit status of an expected failure; (None, 1) for any other error."""
  if isinstance(error, interrupts.Interrupted):
    return f"stopped by {error}", 128 + error.signum
  prefixes = ((config_check.ConfigError, "config error: "),
              (workdir_lib.WorkdirError, "workdir error: "),
              (steps_lib.NonFiniteError, "training stopped: "), (hosts.CoordinatorError, ""),
              (hosts.ProcessFailed, "stopped: "))
  for kind, prefix in prefixes:
    if isinstance(error, kind):
      return prefix + str(error), 1
  return None, 1

