"""Metrics to <workdir>/metrics.jsonl (one JSON object per line, each with "step") and TensorBoard.

On resume the lines after the restored step are dropped, so a resumed run ends with exactly the
lines of an uninterrupted one. Timing goes to TensorBoard only, never to metrics.jsonl.
"""

from __future__ import annotations

import json
import os

from tensorboardX import SummaryWriter


class Logbook:

  def __init__(self, workdir: str, resume_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    kept = []
    if os.path.exists(self.path):
      with open(self.path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resume_step]
    with open(self.path, "w") as f:
      f.writelines(kept)
    self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: dict, extra: dict | None = None) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, **metrics}) + "\n")
    for name, value in {**metrics, **(extra or {})}.items():
      self.writer.add_scalar(name, value, step)

  def close(self):
    self.writer.close()


def read(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]
