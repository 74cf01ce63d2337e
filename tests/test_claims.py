"""Claims are data: every finding sentence that carries a claim pointer is checked against the
rows it names. A pointer is an HTML comment right after its sentence (MyST does not render it):

  ... shown for 16 and 32 heads (Holm p 0.031, 0.020) <!-- claim heads/comparisons.csv:
  arm=heads_16 baseline=heads_1 rate=chosen; arm=heads_32 baseline=heads_1 rate=chosen -->

naming a file under docs/results/ (a comparisons.csv, a results.csv or a predictions table) and,
after the colon, row selectors separated by ";" (``column=value`` pairs; in a results.csv
``stat=max:peak_max_attention_logit`` adds the maximum, minimum or mean of a column over the rows
selected, ``stat=at_least:eval_accuracy:0.9`` how many of them reach 0.9, and either how many rows
have a value). The claim is the text from the previous sentence's end (a blank line, a list item, a
table cell, an earlier pointer, or ". " before a capital) to the pointer. The test fails when

- a number of the claim is not one of its rows' values at its printed precision (a number in an
  arm's name, such as the 16 of heads_16, counts, and so do 0.05 and 95, the level and the
  interval's);
- a word that says an effect was shown ("shown", "detected", "sooner", "faster", "slower",
  "better", "worse", "more", "less", ...), not negated, stands on a row whose p (Holm's where
  the row is in the study's family; the raw p only where the claim says "unadjusted") is not
  below 0.05;
- a word that says two arms are alike ("same", "recovers", "matches", "no worse", "as ... does")
  stands on no equivalence test that passed;
- a finding of the README's list, the index's headlines or a results page's summary (a sentence
  with a verdict word or a measured number) carries no pointer (see ``unpointed``).
"""

import csv
import math
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted(RESULTS.glob("*.md"))]  # index.md among them
ALPHA = 0.05
ROLE = re.compile(r"\{\w+\}`[^`]*`")  # {ref}`Press et al. (2022) <ref-press2022>`, {doc}`heads`
POINTER = re.compile(r"<!--\s*claim\s+(\S+?)(?::(.*?))?\s*-->", re.S)
# a number, not one in a formula or a factor (1/sqrt(d_k), d_k^-1/2, 4.6x)
NUMBER = re.compile(r"(?<![\w./^])[-+−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w/]|\.\d)")
SHOWN = re.compile(r"\b(shown|detected|detectably|sooner|faster|slower|better|worse|beats?|"
                   r"helps?|hurts?|errs? more|more|less|fewer|larger|smaller|lower|higher|"
                   r"grows?)\b")
ALIKE = re.compile(r"\b(same|recovers?|matches|no worse|as [\w\s-]+ does)\b")
NEGATION = re.compile(r"\b(no|not|none|nor|never|cannot|neither|without)\b[^.;,]{0,40}$",
                      re.I)


def claims(text: str):
  """(claim text, source, selectors) for each pointer of ``text``."""
  found, start = [], 0
  for match in POINTER.finditer(text):
    before = ROLE.sub(" ", text[start:match.start()])  # a citation's "et al. (2022)" is not data
    cut = max((m.end() for m in re.finditer(r"\n\s*\n|\n\s*- |\||-->|\.(?:\*\*)?\s+(?=[A-Z*(`])",
                                            before)),
              default=0)
    claim = " ".join(before[cut:].split())
    selectors = [dict(pair.split("=", 1) for pair in part.split())
                 for part in (match.group(2) or "").split(";") if part.strip()]
    found.append((claim, match.group(1), selectors))
    start = match.end()
  return found


def _predictions(path: pathlib.Path) -> list[dict]:
  rows, current = [], ""
  for line in path.read_text().splitlines()[2:]:
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    current = cells[0] or current
    rows.append({"prediction": current, "setting": cells[1], "check": cells[2],
                 "measured": cells[3], "holds": cells[4]})
  return rows


def rows_of(source: str, selectors: list[dict]) -> tuple[list[dict], list[float]]:
  """The rows the selectors name (each must name at least one) and the statistics asked for."""
  path = RESULTS / source
  if path.suffix == ".md":
    table = _predictions(path)
  else:
    with open(path, newline="") as f:
      table = list(csv.DictReader(f))
  chosen, stats = [], []
  for selector in selectors or [{}]:
    selector = dict(selector)
    stat = selector.pop("stat", None)
    rows = [row for row in table if all(row.get(k) == v for k, v in selector.items())]
    assert rows, f"{source}: no row has {selector}"
    chosen += rows
    if stat:
      stats += _statistic(stat, rows)
  return chosen, stats


def _numbers_in(name: str) -> list[float]:
  """The numbers in a name: 16 in heads_16, 41 and 80 in length_41_80_accuracy."""
  return [float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", name)]


def _statistic(stat: str, rows: list[dict]) -> list[float]:
  """``how:column`` (max, min, mean) or ``how:column:threshold`` (at_least, at_most: how many
  rows reach it), with the number of rows that have a value."""
  how, column, *threshold = stat.split(":")
  values = [float(row[column]) for row in rows if row[column] not in ("", "nan")]
  if threshold:
    bound = float(threshold[0])
    count = sum(v >= bound if how == "at_least" else v <= bound for v in values)
    return [count, len(values), bound, *_numbers_in(column)]
  summary = {"max": max, "min": min, "mean": lambda v: sum(v) / len(v)}[how]
  return [summary(values), len(values), *_numbers_in(column)]


def _printed(text: str) -> tuple[float, float]:
  """The number printed and half its last digit's unit (a trailing zero of an integer is not a
  digit of precision: 170 may be 170 +- 5)."""
  text = text.replace("−", "-")
  value = float(text)
  mantissa = text.lstrip("+-").split("e")[0]
  if "." in mantissa:
    unit = 10.0 ** -len(mantissa.split(".")[1])
  else:
    digits = mantissa.rstrip("0") or "0"
    unit = 10.0 ** (len(mantissa) - len(digits))
  if "e" in text:
    unit *= 10.0 ** int(text.split("e")[1])
  return value, unit / 2


def _values(rows, stats) -> list[float]:
  """The numbers a claim on ``rows`` may print: every cell of a comparison or a check; of a
  results.csv's many replica rows only the statistics asked for and the numbers in arm names."""
  values = list(stats) + [100 * (1 - 2 * ALPHA), ALPHA, 1 - ALPHA]
  for row in rows:
    cells = ([row.get("variant") or row.get("arm", ""), row.get("learning_rate", ""),
              row["seed"]] if "seed" in row else row.values())
    for cell in cells:
      try:
        values.append(float(cell))
      except ValueError:  # a name or a sentence: the numbers in it (16 in heads_16)
        values += _numbers_in(str(cell))
  return values


def unsupported_numbers(claim, rows, stats) -> list[str]:
  values = _values(rows, stats)
  missing = []
  for text in NUMBER.findall(claim):
    printed, half = _printed(text)
    if not any(abs(abs(v) - abs(printed)) <= half * (1 + 1e-9) + 1e-12 for v in values):
      missing.append(text)
  return missing


def _decisive(row) -> tuple[float, bool]:
  """(the p a verdict on the row stands on, whether it is unadjusted)."""
  if "holds" in row:  # a predictions table's check: its Holm p, and whether it held
    return (0.0 if row["holds"] == "yes" else 1.0), False
  adjusted = float(row.get("p_adjusted") or "nan")
  return (adjusted, False) if math.isfinite(adjusted) else (float(row["p"]), True)


def _asserted(pattern, claim) -> list[str]:
  return [m.group(0) for m in pattern.finditer(claim)
          if not NEGATION.search(claim[:m.start()])]


def overclaims(claim, rows) -> list[str]:
  problems = []
  tested = [row for row in rows if "p" in row or "holds" in row]
  if _asserted(SHOWN, claim):
    for row in tested:
      p, unadjusted = _decisive(row)
      if not p < ALPHA or (unadjusted and "unadjusted" not in claim):
        problems.append(f"{_asserted(SHOWN, claim)} on p {p:.2g}"
                        + (" (unadjusted, and the claim does not say so)" if p < ALPHA else ""))
  if _asserted(ALIKE, claim):
    passed = [row for row in tested if ("~" in row.get("check", "") and row["holds"] == "yes")
              or (row.get("test", "").startswith("tost") and _decisive(row)[0] < ALPHA)]
    if not passed:
      problems.append(f"{_asserted(ALIKE, claim)} without a passing equivalence test")
  return problems


def _all_claims():
  for page in PAGES:
    for claim, source, selectors in claims(page.read_text()):
      yield pytest.param(claim, source, selectors,
                         id=f"{page.name}:{source}:{claim[:40]}")


@pytest.mark.parametrize("claim, source, selectors", list(_all_claims()))
def test_each_claim_s_numbers_and_words_are_its_rows(claim, source, selectors):
  rows, stats = rows_of(source, selectors)
  assert not unsupported_numbers(claim, rows, stats), (
      f"{claim!r}: {unsupported_numbers(claim, rows, stats)} not in {source} {selectors}")
  assert not overclaims(claim, rows), (claim, overclaims(claim, rows))


# What the checker must catch: sentences the pages once printed, against their rows.
WRONG = [
    ("16 and 32 heads solve sooner (Holm 0.031, 0.020) at a matched rate",
     "heads/comparisons.csv", "arm=heads_16 rate=matched; arm=heads_32 rate=matched"),
    ("split_8 errs less than split_1 (8 seeds)",
     "heads_binding/multi_retrieval_accelerator/comparisons.csv", "arm=split_8"),
    ("the gate started open solves it as plain attention does (Holm 0.13)",
     "attention_variants/controls/comparisons.csv", "arm=gated_open baseline=mha rate=chosen"),
    ("its largest logit stayed at or below 1.06 in every run",
     "scaling_init/results.csv", "variant=dk16_qk_norm_inv stat=max:peak_max_attention_logit"),
]


@pytest.mark.parametrize("claim, source, selector", WRONG, ids=[w[0][:30] for w in WRONG])
def test_the_checker_fails_sentences_that_say_more_than_their_rows(claim, source, selector):
  selectors = [dict(p.split("=", 1) for p in part.split()) for part in selector.split(";")]
  rows, stats = rows_of(source, selectors)
  assert unsupported_numbers(claim, rows, stats) or overclaims(claim, rows)


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_no_pointer_begins_a_line(page):
  """A line that begins with a comment starts an HTML block (CommonMark, so MyST and GitHub
  alike): it ends the paragraph and the rest of that line is printed raw, bold and all."""
  starts = [n for n, line in enumerate(page.read_text().splitlines(), 1)
            if re.match(r"\s*<!--\s*claim", line)]
  assert not starts, f"{page.name}: a claim pointer begins line(s) {starts}"
  # The space before a pointer stays in the page when punctuation follows it ("0.031) ;").
  spaced = [m.group(0)[-40:] for m in re.finditer(r"\s<!--\s*claim[^>]*-->[.,;:)]",
                                                   page.read_text(), re.S)]
  assert not spaced, f"{page.name}: write the pointer against its sentence: {spaced}"


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_pointer_parses_as_an_inline_comment(page):
  """Parsed as CommonMark (with tables, as MyST and GitHub do), every pointer is inline HTML
  inside its paragraph, list item or table cell, never an HTML block of its own."""
  markdown_it = pytest.importorskip("markdown_it")  # comes with the docs' myst-parser
  tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(page.read_text())
  assert not [t.content for t in tokens if t.type == "html_block" and "claim" in t.content]
  inline = sum(len(POINTER.findall(t.content)) for t in tokens if t.type == "inline")
  assert inline == len(POINTER.findall(page.read_text()))


def test_a_pointer_inside_a_line_renders_as_nothing():
  markdown_it = pytest.importorskip("markdown_it")
  html = markdown_it.MarkdownIt("commonmark").render(
      "- **Sooner (Holm 0.031)** <!-- claim heads/comparisons.csv: arm=heads_16\n"
      "  rate=chosen -->, at one head's rate not shown.")
  assert "<strong>Sooner (Holm 0.031)</strong>" in html and "<p>" not in html.split("-->")[1]


def test_a_pointer_does_not_render_and_names_its_sentence():
  text = ("Intro. Four heads solve it sooner (Holm 0.031) <!-- claim heads/comparisons.csv: "
          "arm=heads_16 baseline=heads_1 rate=chosen -->.")
  ((claim, source, selectors),) = claims(text)
  assert claim == "Four heads solve it sooner (Holm 0.031)"
  assert source == "heads/comparisons.csv" and selectors[0]["arm"] == "heads_16"
  rows, stats = rows_of(source, selectors)
  assert not unsupported_numbers(claim, rows, stats) and not overclaims(claim, rows)


# Every finding carries a pointer: in the README's findings, the index's headlines and each
# results page's summary, a sentence with a verdict word or a measured number (a decimal, an
# interval, "n of m", "+n steps", "n steps sooner") and no pointer fails. Numbers of the design
# alone (d_k 64, 10 seeds, T = 8, 500 steps) are not findings.
CODE = re.compile(r"\{\w+\}`[^`]*`|`[^`]*`|\]\([^)]*\)")
VERDICT = re.compile(SHOWN.pattern + "|" + ALIKE.pattern + r"|\b(held|holds|fails?|failed)\b")
MEASURED = re.compile(r"(?<![\w.])\d*\.\d+(?![\w])|\d(?:\.\d+)?e[-+]?\d+|\b\d+ (?:of|in) \d+\b|"
                      r"(?<!\w)[-+]\d+ steps|\b\d+ steps (?:sooner|slower|faster|more|less|of)\b|"
                      r"\[[-+−]?\d")
SENTENCE_END = re.compile(r"\n\s*\n|\n\s*- |\||\.(?:\*\*)?\s+(?=[A-Z*(`])")
# Not findings of ours: a quotation (of a paper, or of an earlier report) and a citation's
# parenthetical, which states the cited paper's claim: ({ref}`Jin et al. 2024 <...>`: equal ...).
QUOTED = re.compile(r'"[^"]*"|\(\{ref\}`[^`]*`[^)]*\)')
# A results page's summary: the bold headline that opens each finding of its lists, with the
# pointers right after it; the page about heads_binding is being rewritten and is not yet held
# to it.
HEADLINE = re.compile(r"^- (\*\*.+?\*\*)((?:\s*<!--\s*claim.*?-->)*)", re.M | re.S)
NOT_YET = {"index.md"}


def unpointed(block: str) -> list[str]:
  """The sentences of ``block`` that state a finding and carry no pointer."""
  pieces = POINTER.split(CODE.sub(" ", QUOTED.sub(" ", block)))[::3]  # text between pointers
  found = []
  for i, piece in enumerate(pieces):
    sentences = SENTENCE_END.split(piece)
    if i < len(pieces) - 1:
      sentences = sentences[:-1]  # the last one is the pointer's own claim
    found += [" ".join(s.split()) for s in sentences if VERDICT.search(s) or MEASURED.search(s)]
  return found


def finding_blocks():
  """(where, text) of every block of findings: the README's list, each index headline, each
  finding's headline on a results page."""
  readme = (ROOT / "README.md").read_text()
  yield "README.md", readme.split("What they found", 1)[1].split("\n## ", 1)[0]
  for line in (RESULTS / "index.md").read_text().splitlines():
    if line.startswith("| {doc}"):
      yield "index.md " + line.split("`")[1], line.strip().strip("|").split(" | ", 2)[2]
  for page in sorted(RESULTS.glob("*.md")):
    if page.name not in NOT_YET:
      text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not the admonitions
      for match in HEADLINE.finditer(text):
        yield f"{page.name} {' '.join(match.group(1).split())[:60]}", match.group(0)[2:]


@pytest.mark.parametrize("where, block", list(finding_blocks()),
                         ids=[where for where, _ in finding_blocks()])
def test_every_finding_carries_a_pointer(where, block):
  assert not unpointed(block), f"{where}: findings without a claim pointer: {unpointed(block)}"


def test_a_finding_without_a_pointer_is_found_and_design_prose_is_not():
  assert unpointed("Four heads solve it sooner (Holm 0.031). At d_k 64, 10 seeds.") == [
      "Four heads solve it sooner (Holm 0.031)"]
  assert unpointed("Sooner (Holm 0.031) <!-- claim heads/comparisons.csv: arm=heads_16 -->. "
                   "With 10 seeds and 2 layers") == []
  assert unpointed('MoH ({ref}`Jin et al. 2024 <ref-jin2024>`: better with 50-75% active), '
                   'which the first report called "faster (p 0.18)"') == []
  assert unpointed("**L1 held.**") == ["**L1 held.**"]
