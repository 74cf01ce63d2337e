"""How a study's values are read from its results: ``Measure`` (a column per arm and seed, at the
chosen learning rate or a fixed one). experiments/findings.py decides a study's checks on these
values and experiments/study_figures.py draws them.
"""

from __future__ import annotations

import dataclasses
import math

from experiments import report_tables, statistics, verdicts

RESULTS = "results"  # the name of a study's results file where it has one


@dataclasses.dataclass(frozen=True)
class Measure:
  """How a check's values are read: ``column`` of the records per seed, ``read`` as "value",
  "error" (1 - value) or "steps" (NaN and beyond ``censored_at`` counted at ``censored_at``), at
  the chosen learning rate or at ``rate``, from results file ``source``; ``differences``: arm ->
  (a, b), an arm whose value per seed is a - b; ``offsets``: arm -> a constant subtracted from
  its every seed (a value against a reference computed apart, e.g. a model's NMSE above an
  idealised model's)."""
  column: str
  read: str = "value"
  rate: float | None = None
  censored_at: float = math.inf
  source: str = RESULTS
  differences: tuple = ()
  offsets: tuple = ()

  def value(self, x) -> float:
    x = float(x)
    if self.read == "error":
      return 1.0 - x
    if self.read == "steps":
      return float(statistics.restricted_times([x], self.censored_at)[0])
    return x

  def of(self, records) -> dict[str, dict[int, float]]:
    """{arm: {seed: value}}."""
    if self.rate is None:
      values = {c.variant: {int(s): self.value(v) for s, v in zip(c.metrics["seed"],
                                                                    c.metrics[self.column])}
                for c in verdicts.choose(records, report_tables.measure_of(records))}
    else:
      values = {}
      for record in records:
        m = record["metrics"]
        for s, rate, v in zip(m["seed"], m["learning_rate"], m[self.column]):
          if float(rate) == self.rate:
            values.setdefault(record["variant"], {})[int(s)] = self.value(v)
    return self.with_differences(values)

  def with_differences(self, values) -> dict[str, dict[int, float]]:
    """``values`` ({arm: {seed: value}}) less their ``offsets``, and the arms of
    ``differences``.

    >>> Measure("eval_nmse", offsets=(("a", 0.25),)).with_differences({"a": {0: 0.5}})
    {'a': {0: 0.25}}
    """
    offsets = dict(self.offsets)
    values = {arm: {s: v - offsets[arm] for s, v in seeds.items()} if arm in offsets else seeds
              for arm, seeds in values.items()}
    for arm, (a, b) in dict(self.differences).items():
      values[arm] = {s: values[a][s] - values[b][s] for s in values[b] if s in values[a]}
    return values
