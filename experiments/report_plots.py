"""The figures of a sweep's report, each readable at page width: at most three panels, human
labels, every line with its own marker and nudged sideways where lines would coincide, 95%
bootstrap intervals inside the measure's range. Those that need only results.csv (final
metrics, learning rates, test sets, probes) are drawn again from a committed CSV; learning
curves and logit maxima need the run's metrics.jsonl.
"""

from __future__ import annotations

import itertools
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import figures, logbook, statistics, verdicts, workdir as workdir_lib  # noqa: E402
from experiments.report_tables import (INTERVAL_NOTE, MAX_LOGIT, accuracy_columns,  # noqa: E402
                                       arm_values, measure_of, metric_range, readable,
                                       readable_arm, varies_learning_rate)

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
MAX_PANELS = 3
# Words for the parts of variant names and of settings that the configs abbreviate.
NAMES = (("inv_sqrt", "1/√dₖ"), ("qk_norm", "QK-norm"), ("inv", "1/dₖ"), ("none", "no scaling"),
         ("learned", "learned temperature"))
SETTINGS = {"model.head_dim": "dₖ", "model.num_heads": "heads",
            "model.positional_encoding": "encoding"}
DEFAULTS = {("model.head_dim", 0): "d_model / h"}  # a setting's value that means "the default"
PROBES_SHOWN = ("entropy", "max_weight", "logit_variance")


def label(name: str, panel: str = "") -> str:
  """A variant's name in words, without what its panel already says (``dk16_`` in the d_k = 16
  panel, ``order-`` in the ``order`` panel); the scaling arms' abbreviations spelled out.

  >>> label("dk16_inv_sqrt", "dₖ = 16"), label("heads_4 learning_rate=0.01")
  ('1/√dₖ', 'heads 4 lr=0.01')
  >>> label("order-none", "order")
  'none'
  """
  scale = re.match(r"dk\d+_", name)
  name = readable_arm(name)
  value = panel.rpartition("= ")[2]
  if value:
    name = re.sub(rf"^[a-z]+{re.escape(value)}_", "", name).removeprefix(f"{value}-")
  for short, words in NAMES if scale else ():  # whole parts: between underscores, spaces, ends
    name = re.sub(rf"(?<![^_ ]){short}(?![^_ ])", words, name)
  return name.replace("_", " ")


def yerr(values_per_point, name):
  """Means and the [below, above] error-bar lengths of their 95% intervals (statistics.
  mean_interval, within the range of the measure ``name``), for matplotlib."""
  means, lows, highs = (np.array(v) for v in zip(*(
      statistics.mean_interval(values, *metric_range(name)) for values in values_per_point)))
  return means, np.nan_to_num(np.stack([means - lows, highs - means]))


def _save(figure, path, bottom=0.0):
  """Laid out above ``bottom`` (the fraction of the height a legend under the panels takes)."""
  figure.tight_layout(rect=(0, bottom, 1, 1))
  figures.save(figure, path)


def _bars(axis, labels, horizontal=False):
  if horizontal:  # the first bar at the top
    axis.set_yticks(np.arange(len(labels)), labels, fontsize=figures.SMALLEST)
    axis.set_ylim(len(labels) - 0.5, -0.5)
  else:
    axis.set_xticks(np.arange(len(labels)), labels, rotation=60, ha="right",
                    fontsize=figures.SMALLEST)


VERTICAL_BARS = 18  # more bars than this lie on their side, their labels on the y axis


def _bar_panels(count: int, bars: int, height: float):
  """``count`` panels of ``bars`` bars each: stacked, the bars upright, for few bars; side by side
  with the bars on their side (labels readable, one per line) for many. Returns the figure, the
  axes and whether the bars lie on their side."""
  if bars <= VERTICAL_BARS:
    figure, axes = plt.subplots(count, 1, squeeze=False, sharex=True,
                                figsize=(min(figures.WIDTH, max(5, 0.38 * bars + 2)),
                                         height * count + 1))
    return figure, list(axes[:, 0]), False
  figure, axes = plt.subplots(1, count, squeeze=False, sharey=True,
                              figsize=(figures.WIDTH, 0.15 * bars + 1.5))
  return figure, list(axes[0]), True


def _shown_columns(records, design) -> list[str]:
  """At most two measures: the design's primary and, where it differs, the test set's."""
  columns = [c for c in accuracy_columns(records) if c.endswith(("_accuracy", "_nmse"))]
  primary = design.primary if design else f"eval_{measure_of(records)}"
  return list(dict.fromkeys([c for c in (f"eval_{measure_of(records)}", primary)
                             if c in columns]))[:2]


def _seed_bars(bars, columns, labels, path, title="") -> None:
  """A panel per measure in ``columns``: a bar per entry of ``bars`` (metrics dicts) at its mean
  with its interval, every seed a dot; ``labels`` beside the bars."""
  figure, axes, horizontal = _bar_panels(len(columns), len(bars), 3.1)
  x = np.arange(len(bars))
  for axis, column in zip(axes, columns):
    values = [np.asarray(metrics[column], np.float64) for metrics in bars]
    means, errors = yerr(values, column)
    bar, label_values, limit = ((axis.barh, axis.set_xlabel, axis.set_xlim) if horizontal else
                                (axis.bar, axis.set_ylabel, axis.set_ylim))
    bar(x, means, capsize=2, color="#8fb0d8", **{"xerr" if horizontal else "yerr": errors})
    for position, value in zip(x, values):
      points = (value, np.full(len(value), position))
      axis.scatter(*(points if horizontal else points[::-1]), s=6, color="k", zorder=3)
    label_values(readable(column), fontsize=figures.SMALLEST)
    if column.endswith("_accuracy"):
      limit(0, 1.02)
    axis.grid(axis="x" if horizontal else "y", alpha=0.3)
  figure.suptitle(title or f"Mean (bar), seeds (dots), {INTERVAL_NOTE}", fontsize=9)
  _bars(axes[0] if horizontal else axes[-1], labels, horizontal)
  _save(figure, path)


def plot_final(records, path, design=None):
  """Every arm's final measure: mean (bar), seeds (dots), interval."""
  armed = arm_values(records)
  _seed_bars([metrics for _, metrics, _ in armed], _shown_columns(records, design),
             [label(name) for name, _, _ in armed], path)


def plot_chosen(records, path, design=None):
  """Each variant at its chosen learning rate: mean (bar), seeds (dots), interval."""
  chosen = verdicts.choose(records, measure_of(records), design)
  _seed_bars([c.metrics for c in chosen], _shown_columns(records, design),
             [f"{label(c.variant)} (lr {c.learning_rate:g}{', edge' if c.edge else ''})"
              for c in chosen], path,
             f"At the learning rate chosen on the {readable(chosen[0].chosen_on)}: mean (bar), "
             f"seeds (dots),\n{INTERVAL_NOTE}; edge: the grid's lowest or highest rate")


def panels(records) -> dict[str, list[dict]]:
  """The finished records split by the first override that varies between them, when more than
  one does and every part holds two or more (scaling: a panel per d_k, a line per scale);
  otherwise one panel."""
  finished = [r for r in records if r["status"] == "ok"]
  settings = [workdir_lib.flatten(r["overrides"]) for r in finished]
  keys = list(dict.fromkeys(k for s in settings for k in s))
  varying = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]
  if len(varying) < 2:
    return {"": finished}
  grouped = {}
  for record, setting in zip(finished, settings):
    key, value = varying[0], setting.get(varying[0])
    grouped.setdefault(f"{SETTINGS.get(key, key)} = {DEFAULTS.get((key, value), value)}",
                       []).append(record)
  if min(len(members) for members in grouped.values()) < 2:
    return {"": finished}
  return grouped


def _figure(count):
  """Panels two to a row (three as two rows, the fourth cell left for the legend), sharing the
  y axis, wide enough to read at page width."""
  rows = -(-count // 2)
  figure, axes = plt.subplots(rows, min(count, 2), figsize=(figures.WIDTH if count > 1 else 4.8,
                                                              3.3 * rows + 0.9),
                              squeeze=False, sharey=True)
  return figure, list(axes.flat)


def _ylabels(axes, count, text):
  """The y label on the first panel of each row."""
  for axis in axes[:count:2]:
    axis.set_ylabel(text, fontsize=8)


def _finish(figure, axes, count) -> float:
  """One legend for the figure's panels (the lines are the same in each): in the spare cell
  where there is one, else under the panels; the unused cells switched off. Returns the
  fraction of the figure's height the legend under the panels takes (0 in a spare cell)."""
  entries = {}  # every line of every panel once, by its label (panels may hold different lines)
  for axis in axes[:count]:
    for handle, name in zip(*axis.get_legend_handles_labels()):
      entries.setdefault(name, handle)
  handles, labels = list(entries.values()), list(entries)
  for axis in axes[count:]:
    axis.axis("off")
  if len(axes) > count:
    axes[count].legend(handles, labels, loc="center", fontsize=figures.SMALLEST, frameon=False)
    return 0.0
  # as many columns (up to 3) as the longest label leaves room for across the figure: an entry
  # is its marker (about 4 characters) and its label, a character about 0.6 of the font size
  entry = (4 + max(map(len, labels), default=0)) * 0.6 * figures.SMALLEST / 72  # inches
  columns = max(1, min(3, int(figure.get_figwidth() // entry)))
  figure.legend(handles, labels, fontsize=figures.SMALLEST, loc="lower center", ncol=columns,
                frameon=False)
  return (0.2 * -(-len(labels) // columns) + 0.1) / figure.get_figheight()


def _errorbars(axis, x, per_point, name, metric, index, count, log_x=False, style=None):
  """Means with intervals at each x, nudged by ``index`` of ``count`` lines so that coinciding
  lines stay visible, with the colour and marker of ``style`` (default ``index``): one style per
  line of the whole figure where its panels hold different lines."""
  means, errors = yerr(per_point, metric)
  spread = (np.asarray(x, np.float64) * (1.06 ** (index - (count - 1) / 2)) if log_x else
            np.asarray(x, np.float64) + 0.06 * (index - (count - 1) / 2))
  axis.errorbar(spread, means, yerr=errors, label=name, ms=4, capsize=2, lw=1.2,
                **_line_style(index if style is None else style))


def _line_style(index: int) -> dict:
  """The colour and marker of a figure's line ``index``: the colours repeat after 10, so each
  round of them shifts the markers by one (no two of the first 100 lines look alike)."""
  return {"color": f"C{index % 10}", "marker": MARKERS[(index + index // 10) % len(MARKERS)]}


def plot_learning_rates(records, path):
  """The final measure against the learning rate, a line per variant, a panel per group (at
  most MAX_PANELS; more groups go to further files, path_2.png, ...)."""
  metric = f"eval_{measure_of(records)}"
  groups = list(panels(records).items())
  paths = []
  for part, start in enumerate(range(0, len(groups), MAX_PANELS)):
    chunk = groups[start:start + MAX_PANELS]
    figure, axes = _figure(len(chunk))
    names = list(dict.fromkeys(label(r["variant"], title) for title, members in chunk
                               for r in members))
    for axis, (title, members) in zip(axes, chunk):
      for index, record in enumerate(members):
        armed = arm_values([record])
        rates = [metrics["learning_rate"][0] for _, metrics, _ in armed]
        name = label(record["variant"], title)
        _errorbars(axis, rates, [metrics[metric] for _, metrics, _ in armed], name, metric,
                   index, len(members), log_x=True, style=names.index(name))
      axis.set_title(title, fontsize=9)
      axis.set_xscale("log")
      axis.xaxis.set_minor_formatter(plt.NullFormatter())  # their 3x10^-4 ... overlap
      axis.set_xlabel("peak learning rate")
      axis.grid(alpha=0.3)
    _ylabels(axes, len(chunk), f"{readable(metric)}\n(mean, {INTERVAL_NOTE})")
    bottom = _finish(figure, axes, len(chunk))
    paths.append(path if part == 0 else path.replace(".png", f"_{part + 1}.png"))
    _save(figure, paths[-1], bottom)
  return paths


def plot_lengths(records, evaluations, path, design=None):
  """The measure on each test set in order (the training distribution's first, then the
  others: longer sequences, the validation stream), a line per arm (each variant at its chosen
  learning rate where the sweep tried several), a panel per task."""
  measure = measure_of(records)
  armed = ([(c.variant, c.metrics, c.record) for c in verdicts.choose(records, measure, design)]
           if varies_learning_rate(records) else arm_values(records))
  groups = {}
  for arm in armed:
    groups.setdefault(str(arm[2]["overrides"].get("task", "")), []).append(arm)
  count = min(len(groups), MAX_PANELS)
  figure, axes = _figure(count)
  for axis, (group, armed) in zip(axes, itertools.islice(groups.items(), MAX_PANELS)):
    for index, (name, metrics, _) in enumerate(armed):
      _errorbars(axis, np.arange(len(evaluations)),
                 [metrics[f"{e}_{measure}"] for e in evaluations], label(name, group), measure,
                 index, len(armed))
    axis.set_xticks(np.arange(len(evaluations)), [readable(e) for e in evaluations],
                    fontsize=figures.SMALLEST, rotation=20)
    axis.set_title(group or readable(f"eval_{measure}") + " by test set", fontsize=9)
    if measure == "accuracy":
      axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
  _ylabels(axes, count, f"{readable('eval_' + measure)}\n(mean, {INTERVAL_NOTE})")
  _save(figure, path, _finish(figure, axes, count))


def plot_probes(records, path):
  """Three probes of the attention, at initialisation and after training, per arm."""
  armed = arm_values(records)
  shown = [p for p in PROBES_SHOWN if f"final_{p}" in armed[0][1]]
  figure, axes, horizontal = _bar_panels(len(shown), len(armed), 2.6)
  x = np.arange(len(armed))
  for axis, probe in zip(axes, shown):
    for offset, stage in ((-0.2, "init"), (0.2, "final")):
      means = [np.mean(metrics[f"{stage}_{probe}"]) for _, metrics, _ in armed]
      words = {"init": "at initialisation", "final": "after training"}[stage]
      if horizontal:
        axis.barh(x + offset, means, height=0.4, label=words)
      else:
        axis.bar(x + offset, means, width=0.4, label=words)
    text = readable(probe) + "\n(mean over seeds)"
    if horizontal:
      axis.set_xlabel(text, fontsize=figures.SMALLEST)
    else:
      axis.set_ylabel(text, fontsize=figures.SMALLEST)
    if probe == "logit_variance":
      (axis.set_xscale if horizontal else axis.set_yscale)("log")
  axes[0].legend(fontsize=figures.SMALLEST)
  _bars(axes[0] if horizontal else axes[-1], [label(name) for name, _, _ in armed], horizontal)
  _save(figure, path)


def plot_curves(workdir, records, path):
  """The measure against step for each variant at its chosen learning rate: the mean, and a
  band from the lowest to the highest seed; a panel per group."""
  measure = measure_of(records)
  chosen = {c.variant: c for c in verdicts.choose(records, measure)}
  column = f"eval_{measure}"
  groups = list(panels(records).items())[:MAX_PANELS]
  figure, axes = _figure(len(groups))
  for axis, (title, members) in zip(axes, groups):
    for index, record in enumerate(members):
      c = chosen[record["variant"]]
      steps, values = logbook.curves(workdir, record, c.metrics["name"], column)
      style = _line_style(index)
      axis.plot(steps, np.nanmean(values, 0), ms=3,
                label=f"{label(c.variant, title)} (lr {c.learning_rate:g})", **style)
      axis.fill_between(steps, np.nanmin(values, 0), np.nanmax(values, 0),
                        color=style["color"], alpha=0.12)
    axis.set_title(title, fontsize=9)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
    # each panel's chosen rates are its own
    axis.legend(fontsize=figures.SMALLEST, loc="lower right")
  _ylabels(axes, len(groups), f"{readable(column)}\n(mean; band: lowest to highest seed)")
  for axis in axes[len(groups):]:
    axis.axis("off")
  _save(figure, path)


def plot_max_logits(workdir, records, path):
  """The largest attention logit against step at the grid's highest learning rate (where
  logit growth shows first), a line per variant, a panel per group, on a log scale."""
  groups = list(panels(records).items())[:MAX_PANELS]
  figure, axes = _figure(len(groups))
  for axis, (title, members) in zip(axes, groups):
    for index, record in enumerate(members):
      highest = max(record["metrics"]["learning_rate"])
      names = [n for n, r in zip(record["metrics"]["name"], record["metrics"]["learning_rate"])
               if r == highest]
      steps, values = logbook.curves(workdir, record, names, MAX_LOGIT)
      axis.plot(steps, np.mean(values, 0), ms=3,
                label=f"{label(record['variant'], title)} (lr {highest:g})", **_line_style(index))
    axis.set_yscale("log")
    axis.set_title(title, fontsize=9)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
  _ylabels(axes, len(groups), readable(MAX_LOGIT) + "\n(mean over seeds)")
  _save(figure, path, _finish(figure, axes, len(groups)))


def per_head_maps(stats: dict[str, np.ndarray], path: str) -> None:
  """A heat map per measure of ``stats`` ({name: [L, N]}): layers by heads, each cell labelled
  with its value."""
  figure, axes = plt.subplots(1, len(stats), figsize=(min(figures.WIDTH, 3 * len(stats)), 2.8),
                              squeeze=False)
  for axis, (name, values) in zip(axes[0], stats.items()):
    image = axis.imshow(values, cmap="magma", aspect="auto")
    layers, heads = values.shape
    axis.set_xticks(range(heads))
    axis.set_yticks(range(layers))
    for layer, head in itertools.product(range(layers), range(heads)):
      axis.text(head, layer, f"{values[layer, head]:.2f}", ha="center", va="center",
                fontsize=figures.SMALLEST, color="gray")
    axis.set(title=name, xlabel="head", ylabel="layer")
    figure.colorbar(image, ax=axis)
  figure.tight_layout()
  figures.save(figure, path, dpi=110)
