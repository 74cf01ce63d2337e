"""Figures are legible where the documentation shows them: every axis text at least 9 CSS pixels
in the 676-pixel text column (experiments.figures), for the report figures redrawn from committed
studies with the most arms and panels, and for the figure helpers themselves."""

import os
import shutil

import matplotlib.pyplot as plt
import pytest

from experiments import figures, sweep_report

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "results")


def shown_px(path):
  text, width = figures.recorded_text_px(path)
  assert text is not None, f"{path} records no text size: save it with experiments.figures.save"
  return text * min(1.0, figures.COLUMN_PX / width)


@pytest.mark.parametrize("study", ["scaling", "positional_registered"])
def test_report_figures_are_legible_at_page_width(tmp_path, study):
  shutil.copy(os.path.join(RESULTS, study, "results.csv"), tmp_path / "results.csv")
  paths = sweep_report.write_from_csv(str(tmp_path / "results.csv"))
  pngs = [p for p in paths.values() if str(p).endswith(".png")]
  assert pngs
  small = {os.path.basename(p): round(shown_px(p), 1) for p in pngs
           if shown_px(p) < figures.LEGIBLE_PX}
  assert not small, f"axis text under 9 px at page width: {small}"


def test_the_recorded_size_is_the_smallest_axis_text(tmp_path):
  figure, axis = plt.subplots(figsize=(4, 3))
  axis.plot([0, 1])
  axis.tick_params(labelsize=12)
  axis.set_xlabel("x", fontsize=7)  # the smallest
  figure.text(0.0, 0.0, "footer", fontsize=3)  # a figure's own footer does not count
  figures.save(figure, tmp_path / "f.png", dpi=100)
  text, width = figures.recorded_text_px(tmp_path / "f.png")
  assert (text, width) == (pytest.approx(7 * 100 / 72, abs=0.05), 400)
  assert shown_px(tmp_path / "f.png") == text  # narrower than the column: shown at its size
  wide, axis = plt.subplots(figsize=(figures.COLUMN_PX / 50, 2))  # shown at half its size
  axis.plot([0, 1])
  axis.tick_params(labelsize=10)
  figures.save(wide, tmp_path / "wide.png", dpi=100)
  assert shown_px(tmp_path / "wide.png") == pytest.approx(10 * 100 / 72 / 2, abs=0.05)
