"""The figures of time and count that the README and the docs quote (the quick tests, the main
job), measured once and written into every page that quotes them, so that no two pages disagree.

  python -m scripts.quoted_figures --measure   # run both, write docs/quoted_figures.json
  python -m scripts.quoted_figures --write     # put the JSON's figures into the pages
  python -m scripts.quoted_figures             # list the pages that disagree with the JSON

``--measure`` runs the README's two commands as a new user runs them (the quick tests in two
processes; the main job in a new workdir, generating the task's data as on a new machine) on an
otherwise idle machine, and records wall time, CPU time, the commit, the versions, the machine and the
date. tests/test_quoted_figures.py fails when a page's figure is not the JSON's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "quoted_figures.json")
sys.path.insert(0, ROOT)
from experiments import provenance  # noqa: E402
QUICK_TESTS = "python -m pytest -q -n 2 -m quick tests"
MAIN_JOB = "python -m experiments.train --config=configs/default.py --workdir=workdir/default"


def about(seconds: float) -> str:
  """A duration as the pages say it: to the half minute, "under a minute" below 45 s.

  >>> about(40), about(70), about(95), about(141)
  ('under a minute', 'about a minute', 'about 1.5 minutes', 'about 2.5 minutes')
  """
  if seconds < 45:
    return "under a minute"
  minutes = round(seconds / 30) / 2
  return "about a minute" if minutes == 1 else f"about {minutes:g} minutes"


@dataclasses.dataclass(frozen=True)
class Quote:
  """Where a page quotes a figure: ``pattern`` (a regular expression whose group 1 is the
  figure; whitespace in it matches any run of whitespace, line breaks included) in ``path``,
  and the text the figures give for that group."""
  path: str
  pattern: str
  text: str

  def regex(self) -> re.Pattern:
    return re.compile(r"\s+".join(self.pattern.split(" ")))


def quotes(figures: dict) -> list[Quote]:
  """Every place the README, the docs and the notebook quote the quick tests or the main job."""
  quick, main, made = figures["quick_tests"], figures["main_job"], figures["provenance"]
  quick_time, main_time = about(quick["seconds"]), about(main["seconds"])
  where = (f"{quick['passed']} tests, {quick['seconds']:.0f} s of wall time and "
           f"{quick['cpu_seconds']:.0f} s of CPU time; {made['machine']}, Python "
           f"{made['python']}, jax {made['jax']}, commit `{made['commit']}`, {made['date']}")
  return [
      *(Quote(page, r"# train a small encoder: ((?:about|under) [^\n]*?) on 2 CPU cores", main_time)
        for page in ("README.md", "docs/index.md")),
      *(Quote(page, r"# the quick tests: ((?:about|under) [^\n]*)", quick_time)
        for page in ("README.md", "docs/index.md")),
      Quote("docs/getting_started.md", r"is a quick subset \(((?:about|under) [a-z0-9. ]*?) on two",
            quick_time),
      Quote("docs/getting_started.md", r"It takes ((?:about|under) [a-z0-9. ]*?) on two CPU cores "
            r"and reaches test accuracy", main_time),
      Quote("docs/getting_started.md", r"reaches test accuracy ([0-9.]+)",
            f"{main['eval_accuracy']:.3f}"),
      Quote("docs/contributing.md", r"Colab set-up: ([^)]*?)\)\.", where),
      Quote("notebooks/colab_quickstart.ipynb",
            r"2-layer encoder; ((?:about|under) [a-z0-9. ]*?) on a CPU", main_time),
  ]


def disagreements(figures: dict, root: str = ROOT) -> list[str]:
  """One line per quote whose page says something else than the figures (or lacks it)."""
  found = []
  for quote in quotes(figures):
    with open(os.path.join(root, quote.path)) as f:
      text = f.read()
    said = [" ".join(match.group(1).split()) for match in quote.regex().finditer(text)]
    if not said:
      found.append(f"{quote.path}: no quote matches {quote.pattern!r}")
    found += [f"{quote.path}: says {s!r}, the figures say {quote.text!r}" for s in said
              if s != quote.text]
  return found


def write(figures: dict, root: str = ROOT) -> None:
  """Puts the figures into every page that quotes them; in a Markdown page a paragraph of prose
  whose quote no longer fits in 100 columns is wrapped again."""
  for quote in quotes(figures):
    path = os.path.join(root, quote.path)
    with open(path) as f:
      text = f.read()
    for match in reversed(list(quote.regex().finditer(text))):
      text = text[:match.start(1)] + quote.text + text[match.end(1):]
      line = text[text.rfind("\n", 0, match.start(1)) + 1:].split("\n", 1)[0]
      in_code = text.count("```", 0, match.start(1)) % 2
      if path.endswith(".md") and len(line) > 100 and not in_code:
        text = _rewrapped(text, match.start(1))
    with open(path, "w") as f:
      f.write(text)


def _rewrapped(text: str, position: int, width: int = 100) -> str:
  r"""``text`` with the paragraph around ``position`` (between blank lines) wrapped at ``width``.

  >>> _rewrapped("a\n\none two three\nfour\n\nb", 6, width=9)
  'a\n\none two\nthree\nfour\n\nb'
  """
  start = text.rfind("\n\n", 0, position) + 2 if "\n\n" in text[:position] else 0
  end = text.find("\n\n", position)
  end = len(text) if end < 0 else end
  paragraph = textwrap.fill(" ".join(text[start:end].split()), width, break_long_words=False,
                            break_on_hyphens=False)
  return text[:start] + paragraph + text[end:]


def _timed(command: str, cwd: str, may_fail=()) -> tuple[float, float, str]:
  """(wall seconds, CPU seconds of the command's processes, its output) of a shell command;
  exits if it fails, unless every failed test is in a file of ``may_fail``."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  result = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  failed = re.findall(r"^FAILED (\S+)", result.stdout, re.M)
  if result.returncode and not (failed and all(test.split("::")[0] in may_fail
                                               for test in failed)):
    sys.exit(f"{command!r} failed (exit {result.returncode}):\n{result.stdout[-2000:]}"
             f"{result.stderr[-2000:]}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu, result.stdout + result.stderr


def measure() -> dict:
  """Runs the quick tests and the main job as the README says; the figures and their provenance."""
  import jax  # pylint: disable=import-outside-toplevel
  python = sys.executable
  # this script's own test fails until the pages carry the new figures (written below)
  wall, cpu, output = _timed(QUICK_TESTS.replace("python", python, 1) + " -p no:cacheprovider",
                             ROOT, may_fail=("tests/test_quoted_figures.py",))
  counts = {word: int(number) for number, word in
            re.findall(r"(\d+) (passed|skipped|failed)", output.strip().splitlines()[-1])}
  quick = {"command": QUICK_TESTS, "passed": counts.get("passed", 0) + counts.get("failed", 0),
           "skipped": counts.get("skipped", 0), "seconds": round(wall, 1),
           "cpu_seconds": round(cpu, 1)}
  with tempfile.TemporaryDirectory() as workdir:
    command = (MAIN_JOB.replace("python", python, 1).replace("workdir/default", workdir)
               + f" --config.data_dir={workdir}/data")  # the task generated, as on a new machine
    wall, cpu, output = _timed(command, ROOT)
  final = json.loads(re.search(r"^final: (.*)$", output, re.M).group(1))
  main = {"command": MAIN_JOB, "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
          "eval_accuracy": final["eval_accuracy"], "steps": final["step"]}
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  made = {"commit": commit, "python": platform.python_version(), "jax": jax.__version__,
          "machine": provenance.machine(), "date": datetime.date.today().isoformat()}
  return {"quick_tests": quick, "main_job": main, "provenance": made}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--measure", action="store_true", help=f"measure and write {FIGURES}")
  parser.add_argument("--write", action="store_true", help="put the figures into the pages")
  args = parser.parse_args()
  if args.measure:
    figures = measure()
    with open(FIGURES, "w") as f:
      json.dump(figures, f, indent=2)
      f.write("\n")
  with open(FIGURES) as f:
    figures = json.load(f)
  if args.write or args.measure:
    write(figures)
  found = disagreements(figures)
  print("\n".join(found) or "every page quotes the figures of " + os.path.relpath(FIGURES, ROOT))
  sys.exit(1 if found else 0)


if __name__ == "__main__":
  main()
