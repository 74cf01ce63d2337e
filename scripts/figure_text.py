"""The smallest text of a matplotlib figure, measured from its pixels: for a PNG that records no
text size (experiments.figures.save records it) and whose data is gone, so that it cannot be
drawn again.

  python -m scripts.figure_text PNG [PNG ...]

The method. A figure's text is black, its data coloured and its footer grey: the pixels that
black ink covers at least half (grey-free: channels within GREY of each other) are split into
connected components, and those no larger than a glyph (GLYPH_PX) are grouped into lines: boxes
that overlap vertically by half the shorter's height and lie within a gap of the taller's height.
A letter or digit is a component taller than wide, MIN_GLYPH_PX or more, two pixels wide (not a
dot, a rule or a speck); a line of two or more has a baseline, the bottom row most of its letters
share. The glyphs standing on it (not a superscript, a descender or a bracket) are measured to a
fraction of a pixel (the antialiased rows at their edges count by their coverage), and the
tallest (a digit, a capital or an ascender) is DIGIT_EM of the font size; where a descender (p,
g, y) hangs from that height, or an i's dot (a mark found at FAINT coverage) stands over a glyph
of that height, it was an x-height, X_HEIGHT_EM of the font size. An axis's label
on its side (matplotlib turns it a quarter, to read upwards) is a line of the transposed image;
each component counts in the direction in which its line holds more components. The smallest
size over the lines is the figure's. A lone glyph is not measured (a one-digit tick label is
left out). A slanted label cannot be measured, and then neither can the figure (None): a line
with fewer than half its letters on the baseline, or letters each alone in its line yet within
its height of another (the steps of a label turned 45 degrees).

How far to trust it, against the 124 figures under docs/ that record their size (110 dpi, 8 to
10 point text; tests/test_figure_text.py checks a sample, and figures drawn at 7 to 10 points):
70 are measured, 69 within TOLERANCE_PX of the recorded size (at most 1.49 px above it), one
2.8 px below it: a line of lowercase letters with neither ascender, descender nor i ("none")
is measured by its x-height as if it were digits. A line whose tallest glyph is an ascender (h,
d, l: 0.76 of the font size) reads up to 4% large. scripts/check_layout.py therefore takes a
measured size less TOLERANCE_PX: a figure passes only if it is legible wherever in its error the
measure lies. 54 are not measured: 53 have slanted
tick labels, and in one grey data (matplotlib's "gray", half black) reads as a slanted label.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import ndimage

GREY = 40  # a pixel of text has channels within this of each other (of 255): not a colour
INK = 0.5  # a pixel of a glyph is at least half covered
FAINT = 0.25  # a pixel of an i's dot, a quarter
GLYPH_PX = 60  # a glyph's box is at most this tall and wide (larger: an axis frame, a curve)
MIN_GLYPH_PX = 4  # a letter or digit stands at least this tall (smaller: a dot, a speck)
DIGIT_EM = 0.73  # a digit's or capital's height over the font size (DejaVu Sans: 0.729)
X_HEIGHT_EM = 0.55  # a lowercase letter's without an ascender (DejaVu Sans: 0.547)
DESCENDER_EM = 0.21  # how far p, g, y reach below the baseline (DejaVu Sans: 0.208)
DOT_EM = 0.15  # the most an i's dot measures either way (DejaVu Sans: 0.11)
TOLERANCE_PX = 1.5  # how far the measure may lie from the recorded size


def _coverage(png) -> np.ndarray:
  """[H, W] in [0, 1]: how much of each pixel of a PNG (a path or a file) black or grey ink
  covers, on white (0 for a colour)."""
  from PIL import Image  # noqa: PLC0415 -- matplotlib's own dependency, needed only here
  with Image.open(png) as image:
    rgba = np.asarray(image.convert("RGBA"), dtype=float)
  alpha = rgba[..., 3:] / 255.0
  rgb = rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)
  return np.where(np.ptp(rgb, axis=-1) <= GREY, 1.0 - rgb.max(axis=-1) / 255.0, 0.0)


def _glyphs(coverage: np.ndarray, ink: float = INK) -> np.ndarray:
  """[G, 4] int: the boxes (top, bottom, left, right; bottom and right exclusive) of the
  connected components of pixels covered ``ink`` or more, no larger than a glyph."""
  labels, _ = ndimage.label(coverage >= ink, structure=np.ones((3, 3)))
  boxes = np.array([(s[0].start, s[0].stop, s[1].start, s[1].stop)
                    for s in ndimage.find_objects(labels)], dtype=int).reshape(-1, 4)
  return boxes[(boxes[:, 1] - boxes[:, 0] <= GLYPH_PX) & (boxes[:, 3] - boxes[:, 2] <= GLYPH_PX)]


def _lines(boxes: np.ndarray) -> np.ndarray:
  """[G] int: a line number per glyph box: boxes that overlap vertically by half the shorter's
  height and lie within a gap of the taller's height of each other share a line."""
  count = len(boxes)
  parent = np.arange(count)

  def root(i):
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  top, bottom, left, right = boxes.T
  height = bottom - top
  for i in range(count):
    overlap = np.minimum(bottom[i], bottom) - np.maximum(top[i], top)
    gap = np.maximum(left[i], left) - np.minimum(right[i], right)
    near = ((overlap * 2 >= np.minimum(height[i], height)) & (overlap > 0)
            & (gap <= np.maximum(height[i], height)))
    for j in np.flatnonzero(near[i + 1:]) + i + 1:
      parent[root(j)] = root(i)
  return np.array([root(i) for i in range(count)], dtype=int)


def _height(coverage: np.ndarray, glyph) -> float:
  """A glyph's height to a fraction of a pixel: its box's rows less the two at its edges, and
  those and the rows just beyond them by the share of the glyph's darkest coverage they reach
  (an antialiased edge covers its row in part)."""
  top, bottom, left, right = glyph
  rows = coverage[max(top - 1, 0):bottom + 1, left:right].max(axis=1)
  edges = np.r_[rows[:2], rows[-2:]] / rows.max()
  return float(bottom - top - 2 + np.sum(np.minimum(edges, 1.0)))


def _dotted(glyph, marks: np.ndarray, height: float) -> bool:
  """Whether one of ``marks`` is a dot just above ``glyph`` (an i's), no larger than
  DOT_EM / X_HEIGHT_EM of the x-height ``height``, within half of it above."""
  top, bottom, left, right = marks.T
  small = (bottom - top <= DOT_EM / X_HEIGHT_EM * height) & (right - left <= DOT_EM / X_HEIGHT_EM
                                                              * height)
  above = (bottom <= glyph[0]) & (bottom >= glyph[0] - height / 2)
  centred = np.abs((left + right) / 2 - (glyph[2] + glyph[3]) / 2) <= 1 + (glyph[3] - glyph[2]) / 2
  return bool(np.any(small & above & centred))


def _line_sizes(coverage: np.ndarray, glyphs: np.ndarray, marks: np.ndarray) -> list[float]:
  """The font sizes (px) of the text lines among ``glyphs`` (as _glyphs gives them in
  ``coverage``; ``marks``: every component found with them), NaN for a slanted one."""
  sizes = []
  lines = _lines(glyphs)
  for line in np.unique(lines):
    top, bottom, left, right = glyphs[lines == line].T
    tall = bottom - top
    # Letters and digits: taller than wide, MIN_GLYPH_PX or more, two pixels wide (not a dot, a
    # rule or a speck).
    letters = (tall > right - left) & (tall >= MIN_GLYPH_PX) & (right - left >= 2)
    if np.sum(letters) < 2:  # a lone glyph: a speck, a marker, a one-digit tick label
      continue
    # The baseline: the bottom row that most letters share (within a pixel), the lowest on a tie.
    sharing = np.sum(np.abs(bottom[letters][:, None] - bottom[letters][None, :]) <= 1, axis=1)
    baseline = np.max(bottom[letters][sharing == sharing.max()])
    standing = np.abs(bottom - baseline) <= 1
    # Half the letters or more of a line stand on its baseline; where they do not (a slanted
    # label), the line cannot be measured (NaN).
    if np.sum(standing & letters) < np.sum(letters) / 2:
      sizes.append(float("nan"))
      continue
    height = max(_height(coverage, glyph) for glyph in glyphs[lines == line][standing])
    # A descender hanging from the tallest glyphs' top marks a line of lowercase letters without
    # an ascender: p, g, y reach DESCENDER_EM / X_HEIGHT_EM = 0.38 of the x-height below the
    # baseline; a bracket beside digits, 0.18 of their height.
    hanging = ((np.abs(top - (bottom[standing].max() - height)) <= 1)
               & (bottom - bottom[standing].max() >= 0.25 * height))
    # So does an i whose stem is as tall as the line's tallest glyph.
    dotted = any(_dotted(glyph, marks, height) for glyph in glyphs[lines == line][standing]
                 if _height(coverage, glyph) >= height - 1)
    sizes.append(height / (X_HEIGHT_EM if hanging.any() or dotted else DIGIT_EM))
  return sizes


def _slanted(glyphs: np.ndarray) -> bool:
  """Whether some letters stand alone in their lines yet next to each other (within their
  height, centre to centre): the glyphs of a slanted label, each a step above the last."""
  lines = _lines(glyphs)
  top, bottom, left, right = glyphs.T
  lone = ((np.bincount(lines)[lines] == 1) & (bottom - top > right - left)
          & (bottom - top >= MIN_GLYPH_PX) & (right - left >= 2))
  centres = np.stack([(top + bottom) / 2, (left + right) / 2], axis=1)[lone]
  apart = np.linalg.norm(centres[:, None] - centres[None, :], axis=-1)
  np.fill_diagonal(apart, np.inf)
  return bool(np.any(apart <= (bottom - top)[lone][:, None]))


def text_sizes(png) -> list[float]:
  """The font sizes (px) of the lines of text of a PNG, level and on their side, smallest
  first; NaN (last) for a slanted one."""
  coverage = _coverage(png)
  across, down = _glyphs(coverage), _glyphs(coverage.T)  # down: in the transposed image

  def line_lengths(glyphs):
    lines = _lines(glyphs)
    return np.bincount(lines)[lines]

  down_length = {tuple(g[[2, 3, 0, 1]]): n for g, n in zip(down, line_lengths(down))}
  level = line_lengths(across) >= [down_length[tuple(g)] for g in across]
  turned = {tuple(g[[2, 3, 0, 1]]) for g in across[~level]}
  on_side = np.array([tuple(g) in turned for g in down], dtype=bool)
  # An i's dot may be too faint to be a glyph: marks are found at FAINT coverage too.
  sizes = (_line_sizes(coverage, across[level], np.r_[across, _glyphs(coverage, FAINT)])
           + _line_sizes(coverage.T, down[on_side], np.r_[down, _glyphs(coverage.T, FAINT)]))
  if _slanted(across):
    sizes.append(float("nan"))
  return sorted(sizes, key=lambda size: (np.isnan(size), size))


def smallest_text_px(png) -> float | None:
  """The smallest font size (px) of a PNG's text measured from its pixels; None where it finds
  no text, or text it cannot measure (a slanted label)."""
  sizes = text_sizes(png)
  return None if not sizes or np.isnan(sizes[-1]) else sizes[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("pngs", nargs="+")
  for path in parser.parse_args().pngs:
    size = smallest_text_px(path)
    print(f"{'not measured' if size is None else f'{size:.1f} px'}  {path}")


if __name__ == "__main__":
  main()
