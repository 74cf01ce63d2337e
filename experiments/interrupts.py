"""SIGTERM and SIGINT during training: the loop finishes its step, saves a checkpoint and stops.

``stop_requests`` collects the signals instead of letting them kill the process; the loop raises
``Interrupted`` once the checkpoint is saved, and the command ends with its line
(experiments/cli.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import jax

from experiments import workdir as workdir_lib


class Interrupted(RuntimeError):
  """SIGTERM or SIGINT stopped the run after a checkpoint of its last step."""

  def __init__(self, signum: int, step: int):
    self.signum, self.step = signum, step
    super().__init__(f"{signal.Signals(signum).name} at step {step}: checkpoint saved; resume "
                     f"with: {workdir_lib.command_line()}")


@contextlib.contextmanager
def stop_requests():
  """SIGTERM and SIGINT received during the block, collected in the yielded list instead of
  killing the process (a second SIGINT interrupts at once). Only the main thread gets signals.
  With several processes SIGTERM is left to JAX's preemption service, which makes every process
  stop at the same step (hosts.preempted), and SIGINT is passed on to it as a SIGTERM."""
  received = []
  if threading.current_thread() is not threading.main_thread():
    yield received
    return

  def handler(signum, frame):
    if received and signum == signal.SIGINT:
      raise KeyboardInterrupt
    received.append(signum)

  def to_preemption_service(signum, frame):
    os.kill(os.getpid(), signal.SIGTERM)
  if jax.process_count() > 1:
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, to_preemption_service)}
  else:
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield received
  finally:
    for s, h in previous.items():
      signal.signal(s, h)
