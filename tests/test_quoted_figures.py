"""The figures of time and count that the pages quote (the quick tests, the main job) are the
measured ones of docs/quoted_figures.json, on every page (scripts/quoted_figures.py)."""

import json
import os
import shutil

import pytest

from scripts import quoted_figures

pytestmark = pytest.mark.quick


def _figures():
  with open(quoted_figures.FIGURES) as f:
    return json.load(f)


def test_every_page_quotes_the_measured_figures():
  assert quoted_figures.disagreements(_figures()) == []


def test_a_page_that_disagrees_is_found_and_rewritten(tmp_path):
  figures = _figures()
  for quote in quoted_figures.quotes(figures):
    os.makedirs(tmp_path / os.path.dirname(quote.path), exist_ok=True)
    shutil.copy(os.path.join(quoted_figures.ROOT, quote.path), tmp_path / quote.path)
  slower = {**figures, "quick_tests": {**figures["quick_tests"],
                                       "seconds": figures["quick_tests"]["seconds"] + 600}}
  found = quoted_figures.disagreements(slower, str(tmp_path))
  assert len(found) == 3 + 1  # README, index, getting started; contributing's seconds
  assert all("the figures say" in line for line in found)
  quoted_figures.write(slower, str(tmp_path))
  assert quoted_figures.disagreements(slower, str(tmp_path)) == []
  assert quoted_figures.disagreements(figures, str(tmp_path)) != []
