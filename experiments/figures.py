"""Saving a figure with the size of its smallest axis text recorded in the PNG, so that a page's
layout check can tell whether the figure is legible where it is shown (scripts/check_layout.py:
the recorded size times the figure's rendered scale must reach 9 px).

The size is of what reads the data: tick labels, axis labels, titles, legends and notes inside
the axes (a colour bar's too). A figure's own footer (``figure.text``: provenance in grey) is not
counted.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TEXT_KEY = "Smallest axis text (px)"
# The documentation's text column at a 1280-pixel window is 676 CSS pixels wide, so a figure
# W inches wide is shown at 676 / (dpi W) of its size and its text of s points at s 676 / (72 W)
# pixels: at most WIDTH inches wide with text of at least SMALLEST points, that is 10 pixels.
COLUMN_PX = 676
LEGIBLE_PX = 9  # the smallest axis text a shown figure may have, in CSS pixels
WIDTH = 7.5  # inches
SMALLEST = 8  # points


def _axis_texts(axis):
  """The visible, non-empty texts that read one axes' data."""
  texts = [*axis.get_xticklabels(which="both"), *axis.get_yticklabels(which="both"),
           axis.xaxis.label, axis.yaxis.label, axis.title, *axis.texts]
  legend = axis.get_legend()
  texts += legend.get_texts() if legend else []
  return [text for text in texts if text.get_visible() and text.get_text().strip()]


def smallest_text_px(figure, dpi: float) -> float:
  """The height in pixels (font size at ``dpi``) of the smallest text of the figure's axes.

  >>> figure, axis = plt.subplots()
  >>> _ = axis.plot([0, 1]); _ = axis.tick_params(labelsize=9)
  >>> smallest_text_px(figure, dpi=144)  # 9 pt at 144 dots per inch
  18.0
  >>> plt.close(figure)
  """
  figure.canvas.draw()  # tick labels exist once the figure is laid out
  sizes = [text.get_fontsize() for axis in figure.axes for text in _axis_texts(axis)]
  return min(sizes) * dpi / 72 if sizes else float("inf")


def recorded_text_px(png) -> tuple[float | None, int]:
  """The smallest axis text (px) that a PNG (a path or a file) saved by ``save`` records (None
  for one saved otherwise), and the PNG's width in pixels."""
  from PIL import Image  # noqa: PLC0415 -- matplotlib's own dependency, needed only here
  with Image.open(png) as image:
    value = image.text.get(TEXT_KEY)
    return (None if value is None else float(value)), image.size[0]


def save(figure, path: str, dpi: float = 110, **savefig_kwargs) -> None:
  """``figure.savefig(path, dpi=dpi)`` with the smallest axis text's size in the PNG's metadata
  (``TEXT_KEY``), then the figure closed."""
  metadata = {TEXT_KEY: f"{smallest_text_px(figure, dpi):.1f}"}
  figure.savefig(path, dpi=dpi, metadata=metadata, **savefig_kwargs)
  plt.close(figure)
