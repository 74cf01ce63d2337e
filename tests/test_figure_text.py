"""The smallest text of a figure measured from its pixels (scripts/figure_text.py) agrees with the
size experiments.figures.save records, and every figure the documentation shows has its text size
known, recorded or measured, so that scripts/check_layout.py checks it."""

import io
import os
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from experiments import figures
from scripts import check_layout, figure_text

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
RESULTS = os.path.join(DOCS, "results")


def _curves(points: float, dpi: float, path=None, record: bool = True):
  """A learning-curve figure with all its text at ``points``: the recorded size (px) and the PNG."""
  figure, axis = plt.subplots(figsize=(4, 3), layout="constrained")
  axis.plot([0, 400], [0.5, 1.0], label="mha lr=0.001")
  axis.tick_params(labelsize=points)
  axis.set_xlabel("step (thousands)", fontsize=points)
  axis.set_ylabel("Test accuracy", fontsize=points)
  axis.legend(fontsize=points)
  png = path or io.BytesIO()
  if record:
    figures.save(figure, png, dpi=dpi)
  else:
    figure.savefig(png, dpi=dpi)
    plt.close(figure)
  if not path:
    png.seek(0)
  return points * dpi / 72, png


@pytest.mark.parametrize("points, dpi", [(7, 110), (10, 110), (8, 144)])
def test_the_measured_size_is_the_recorded_one(points, dpi):
  recorded, png = _curves(points, dpi)
  assert figure_text.smallest_text_px(png) == pytest.approx(recorded,
                                                            abs=figure_text.TOLERANCE_PX)


@pytest.mark.parametrize("name", ["heads_binding/multi_retrieval_10seeds/learning_curves.png",
                                  "positional_causal/order/max_attention_logits.png",
                                  "heads_length/probes.png"])
def test_committed_figures_measure_as_they_record(name):
  path = os.path.join(RESULTS, name)
  recorded = figures.recorded_text_px(path)[0]
  assert figure_text.smallest_text_px(path) == pytest.approx(recorded,
                                                             abs=figure_text.TOLERANCE_PX)


def test_slanted_labels_and_blank_images_are_not_measured(tmp_path):
  figure, axis = plt.subplots(figsize=(4, 3), layout="constrained")
  axis.bar(range(3), [1, 2, 3])
  axis.set_xticks(range(3), ["mha lr=0.001", "gated lr=0.003", "sinks lr=0.01"], rotation=45,
                  ha="right")
  figure.savefig(tmp_path / "slanted.png", dpi=110)
  plt.close(figure)
  assert figure_text.smallest_text_px(tmp_path / "slanted.png") is None
  Image.fromarray(np.full((50, 80, 3), 255, np.uint8)).save(tmp_path / "blank.png")
  assert figure_text.smallest_text_px(tmp_path / "blank.png") is None


def test_the_layout_check_measures_a_figure_that_records_nothing(tmp_path):
  page = str(tmp_path / "page.html")
  _curves(8, 110, tmp_path / "recorded.png")
  _curves(8, 110, tmp_path / "unrecorded.png", record=False)
  Image.fromarray(np.full((50, 80, 3), 255, np.uint8)).save(tmp_path / "blank.png")
  shown = [("recorded.png", 440, 440), ("unrecorded.png", 440, 440), ("unrecorded.png", 220, 440),
           ("blank.png", 80, 80)]
  problems, unchecked, measured = check_layout.legibility(page, shown)
  assert measured == 2 and unchecked == ["blank.png"]
  # 12.2 px, measured less its tolerance: legible at full size, not at half size.
  assert len(problems) == 1 and "less its tolerance, shown at 50%" in problems[0]


def _shown_pngs() -> set[str]:
  """The PNGs the documentation's pages show (markdown images, image and figure directives)."""
  shown = set()
  for folder, _, names in os.walk(DOCS):
    if {"_build", "_static"} & set(folder.split(os.sep)):
      continue
    for name in (n for n in names if n.endswith(".md")):
      with open(os.path.join(folder, name)) as f:
        text = f.read()
      for source in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)|```\{(?:image|figure)\}\s+(\S+\.png)",
                               text):
        shown.add(os.path.normpath(os.path.join(folder, next(s for s in source if s))))
  return shown


def test_every_figure_the_docs_show_has_a_known_text_size():
  shown = _shown_pngs()
  assert len(shown) > 20  # the results pages' figures are found
  unknown = [os.path.relpath(png, DOCS) for png in sorted(shown)
             if figures.recorded_text_px(png)[0] is None
             and figure_text.smallest_text_px(png) is None]
  assert not unknown, f"neither recorded nor measurable (save with experiments.figures.save): " \
                      f"{unknown}"
