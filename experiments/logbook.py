"""Metrics of one replica to <replica dir>/metrics.jsonl (a JSON object per line, each with "step")
and TensorBoard.

On resume the lines after the restored step are dropped (and a line cut short by a kill or a full
disk), so a resumed run ends with exactly the lines of an uninterrupted one. Timing goes to
TensorBoard only, never to metrics.jsonl.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from tensorboardX import SummaryWriter

from experiments import workdir as workdir_lib


def lines(path: str) -> list[dict]:
  """The records of a metrics.jsonl file, up to a last line cut short."""
  records = []
  with open(path) as f:
    for text in f:
      try:
        records.append(json.loads(text))
      except json.JSONDecodeError:  # a line whose write was cut short; always the last
        break
  return records


class Logbook:

  def __init__(self, directory: str, resume_step: int = 0):
    os.makedirs(directory, exist_ok=True)
    self.path = os.path.join(directory, "metrics.jsonl")
    kept = lines(self.path) if os.path.exists(self.path) else []
    workdir_lib.write_atomically(self.path, "".join(
        json.dumps(line) + "\n" for line in kept if line["step"] <= resume_step))
    self.writer = SummaryWriter(os.path.join(directory, "tensorboard"))

  def write(self, step: int, metrics: dict, extra: dict | None = None) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, **metrics}) + "\n")
    for name, value in {**metrics, **(extra or {})}.items():
      self.writer.add_scalar(name, value, step)

  def close(self):
    self.writer.close()


def read(workdir: str, replica: int = 0) -> list[dict]:
  """The metrics.jsonl lines of replica ``replica`` (its index on the replica axis) of a run."""
  name = workdir_lib.read_replicas(workdir)[replica]["name"]
  return lines(os.path.join(workdir_lib.replica_dir(workdir, name), "metrics.jsonl"))


def curves(workdir: str, record: dict, names, metric: str = "eval_accuracy"):
  """Steps and values [replicas, steps] of ``metric`` from the metrics.jsonl of the replicas
  ``names`` of a sweep variant (trained together, alone under <variant>/alone/, or in a
  bracketing extension of its grid)."""
  per_replica = []
  for name in names:
    pattern = os.path.join(glob.escape(workdir), "variants", record["variant"], "**", "replicas",
                           name, "metrics.jsonl")
    (path,) = glob.glob(pattern, recursive=True)[:1] or [None]
    if path is None:
      raise ValueError(f"no metrics.jsonl for replica {name} of variant {record['variant']}")
    per_replica.append([(line["step"], line[metric]) for line in lines(path) if metric in line])
  steps = [step for step, _ in per_replica[0]]
  return np.array(steps), np.array([[value for _, value in points] for points in per_replica])
