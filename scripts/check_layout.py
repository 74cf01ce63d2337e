"""Every page of the built site at 1280 x 800 in headless Chromium: what overflows its box.

  python scripts/check_layout.py SITE_DIR [PAGE ...] [--chromium PATH] [--width 1280]

(PAGE: paths under SITE_DIR, e.g. results/heads_binding.html; default every page.)

For each HTML page under SITE_DIR (sphinx-build's output), a copy with a small script is loaded
in headless Chromium; after layout the script lists the tables, code blocks, notes and images of
the article that are wider than their box (a table's last columns behind a scroll bar, a command
cut at a note's edge), code that wraps (a code block rendered on more lines than its text has: it
should scroll sideways; a token of inline code split across lines), the words of headers split
across lines other than at a hyphen or a slash ("defa|ult"), pages without a title, and figures
whose smallest axis text is under 9 px as shown (the size a PNG saved by experiments.figures.save
records, or, for a PNG that records none, the size scripts/figure_text.py measures from its
pixels less the measure's tolerance, times the figure's shown width over its drawn width; a
figure with neither is counted as unchecked). Mathematics is left out (MathJax's glyphs
overhang their boxes by a few pixels, visibly nothing). Exit status 1 if any page has one, or
any figure is unchecked.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import figures  # noqa: E402
from scripts import figure_text  # noqa: E402

PROBE = """
window.addEventListener('load', () => {
  const found = [];
  const article = document.querySelector('article') || document.body;
  article.querySelectorAll('table, div.admonition, img').forEach(element => {
    const parent = element.parentElement;
    const box = parent && parent.classList.contains('pst-scrollable-table-container')
        ? parent : element;
    if (box.scrollWidth > box.clientWidth + 2) {
      const text = (element.innerText || element.getAttribute('src') || '').replace(/\\s+/g, ' ');
      found.push(`${element.tagName.toLowerCase()} ${box.scrollWidth} px in ${box.clientWidth}: `
                 + text.slice(0, 60));
    }
  });
  // A word of a header split across lines anywhere but at a hyphen or a slash ("defa|ult").
  article.querySelectorAll('th, h1, h2, h3').forEach(header => {
    const walker = document.createTreeWalker(header, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.data.matchAll(/[^\\s\\-\\/]+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const lines = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                .map(r => Math.round(r.top)));
        if (lines.size > 1) found.push(`${header.tagName.toLowerCase()} breaks "${word[0]}"`);
      }
    }
  });
  // Code must never wrap: a block scrolls sideways instead, and inline code breaks only between
  // words. A block wraps when it renders more lines than its text has; a token of inline code is
  // broken when its letters lie on more than one line.
  const lineCount = range => new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                       .map(r => Math.round(r.top / 4))).size;
  article.querySelectorAll('pre').forEach(block => {
    const range = document.createRange();
    range.selectNodeContents(block);
    const lines = block.textContent.replace(/\\n$/, '').split('\\n').length;
    const shown = lineCount(range);
    if (shown > lines) {
      found.push(`code block wraps (${lines} lines shown on ${shown}): `
                 + block.textContent.replace(/\\s+/g, ' ').slice(0, 60));
    }
  });
  article.querySelectorAll(':not(pre) > code').forEach(code => {
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const token of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, token.index);
        range.setEnd(node, token.index + token[0].length);
        if (lineCount(range) > 1) found.push(`code breaks "${token[0]}"`);
      }
    }
  });
  if (!document.querySelector('h1')) found.push('no title (h1)');
  document.body.setAttribute('data-overflow', JSON.stringify(found));
  // Each figure's shown and drawn widths: legible() reads the text size its PNG records.
  const images = Array.from(article.querySelectorAll('img')).filter(image => image.naturalWidth)
      .map(image => [image.getAttribute('src'), image.clientWidth, image.naturalWidth]);
  document.body.setAttribute('data-images', JSON.stringify(images));
});
"""
SKIPPED = ("genindex.html", "search.html", "py-modindex.html")


def text_px(page: str, source: str) -> tuple[float | None, str]:
  """The smallest axis text (px) of the figure at ``source`` (relative to ``page``, or a data
  URI), and how it is known: "recorded" (experiments.figures.save), or measured from the pixels
  (scripts/figure_text.py) less the measure's tolerance, so that a figure passes only if its
  text is legible wherever in its error the measure lies; (None, "") for neither."""
  if source.startswith("data:image/png;base64,"):
    png = io.BytesIO(base64.b64decode(source.partition(",")[2]))
  else:
    png = os.path.join(os.path.dirname(page), html.unescape(source).split("#")[0])
    if not source.lower().endswith(".png") or not os.path.exists(png):
      return None, ""
  recorded = figures.recorded_text_px(png)[0]
  if recorded is not None:
    return recorded, "recorded"
  if isinstance(png, io.BytesIO):
    png.seek(0)
  measured = figure_text.smallest_text_px(png)
  if measured is None:
    return None, ""
  return measured - figure_text.TOLERANCE_PX, "measured, less its tolerance"


def legibility(page: str, images: list) -> tuple[list[str], list[str], int]:
  """The figures on ``page`` whose smallest axis text is under figures.LEGIBLE_PX as shown, the
  figures whose text size is neither recorded nor measurable, and how many were measured."""
  problems, unchecked, measured = [], [], 0
  for source, shown, drawn in images:
    text, how = text_px(page, source)
    measured += how.startswith("measured")
    if text is None:
      unchecked.append(source[:80])
    elif text * shown / drawn < figures.LEGIBLE_PX:
      problems.append(f"figure text {text * shown / drawn:.1f} px as shown ({text:.1f} px drawn, "
                      f"{how}, shown at {shown / drawn:.0%}): {source[:60]}")
  return problems, unchecked, measured


def pages(site: str) -> list[str]:
  return sorted(os.path.join(folder, name) for folder, _, names in os.walk(site)
                for name in names if name.endswith(".html") and name not in SKIPPED
                and not {"_static", "_sources"} & set(folder.split(os.sep)))


def overflow(page: str, chromium: str, width: int, profile: str
             ) -> tuple[list[str], list[str], int]:
  """What overflows on ``page``, loaded at ``width`` x 800 from a probing copy beside it, with its
  illegible figures; its figures whose text size is unknown; how many were measured."""
  with open(page) as f:
    text = f.read()
  copy = page[:-len(".html")] + ".layout-probe.html"
  with open(copy, "w") as f:
    f.write(text.replace("</head>", f"<script>{PROBE}</script></head>", 1))
  try:
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={profile}",
         f"--window-size={width},800", "--virtual-time-budget=2000", "--dump-dom",
         "file://" + os.path.abspath(copy)], capture_output=True, text=True, timeout=120)
  finally:
    os.remove(copy)
  found = re.search(r'data-overflow="([^"]*)"', result.stdout)
  images = re.search(r'data-images="([^"]*)"', result.stdout)
  if not (found and images):
    return ["the page did not load"], [], 0
  illegible, unchecked, measured = legibility(page, json.loads(html.unescape(images.group(1))))
  return json.loads(html.unescape(found.group(1))) + illegible, unchecked, measured


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("site", help="sphinx-build's HTML output")
  parser.add_argument("only", nargs="*", help="pages to check, relative to site (default all)")
  parser.add_argument("--chromium", default="chromium")
  parser.add_argument("--width", type=int, default=1280)
  args = parser.parse_args()
  found, unchecked, measured = {}, [], 0
  checked = ([os.path.join(args.site, page) for page in args.only] if args.only
             else pages(args.site))
  with tempfile.TemporaryDirectory() as profile:
    for page in checked:
      problems, unknown, count = overflow(page, args.chromium, args.width, profile)
      unchecked += [f"{os.path.relpath(page, args.site)}: {source}" for source in unknown]
      measured += count
      if problems:
        found[os.path.relpath(page, args.site)] = problems
  for page, problems in found.items():
    print(page)
    for problem in problems:
      print("  ", problem)
  for figure in unchecked:
    print("text size neither recorded nor measurable:", figure)
  print(f"{len(checked)} pages at {args.width} px: "
        f"{len(found)} with something wider than its box or an illegible figure; "
        f"{measured} figures' text measured from their pixels (they record no size); "
        f"{len(unchecked)} unchecked")
  sys.exit(1 if found or unchecked else 0)


if __name__ == "__main__":
  main()
