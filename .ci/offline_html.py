"""Fails (exit 1) if a page of the built site would need the network to render: a <script> or
<link> whose source is on another host (MathJax included), or a page with formulas that does not
load the bundled MathJax from _static/.

  python .ci/offline_html.py BUILD_DIR
"""

import pathlib
import re
import sys

REMOTE = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(https?:)?//[^\"]*\"", re.I)
MATH = re.compile(r'class="math\b')  # how Sphinx marks a formula


def problems(root: pathlib.Path) -> list[str]:
  found = []
  for page in sorted(root.rglob("*.html")):
    text = page.read_text(encoding="utf-8", errors="replace")
    for match in REMOTE.finditer(text):
      found.append(f"{page.relative_to(root)}: loads {match.group(0)[:120]}")
    if MATH.search(text) and "_static/mathjax/tex-chtml.js" not in text:
      found.append(f"{page.relative_to(root)}: has formulas but no bundled MathJax")
  return found


if __name__ == "__main__":
  root = pathlib.Path(sys.argv[1])
  pages = list(root.rglob("*.html"))
  found = problems(root)
  print("\n".join(found) or f"offline: {len(pages)} pages load nothing from the network")
  sys.exit(1 if found or not pages else 0)
