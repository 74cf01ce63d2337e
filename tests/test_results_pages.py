"""The numbers the results pages state about their studies, against the CSVs the studies wrote:
the seeds per setting of docs/results/index.md, counted in every results.csv."""

import collections
import csv
import pathlib
import re

import pytest

pytestmark = pytest.mark.quick

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"

# The index's "Seeds per setting" sentence: each study's words in it (a pattern that must follow
# its number there) and its results.csv files.
SEEDS = {
    "heads": (r"(\d+) for heads,", ["heads"]),
    "scaling": (r"(\d+) for heads, scaling,", ["scaling"]),
    "tuned scaling": (r"(\d+) for [^;]*tuned scaling", ["scaling_init"]),
    "head variants": (r"(\d+) for [^;]*head variants",
                      ["head_variants/mqar", "head_variants/order_4", "head_variants/order_16"]),
    "farthest point's floor": (r"(\d+) for [^;]*farthest point's floor", ["farthest_floor"]),
    "pre-registered positional": (r"(\d+) for [^;]*pre-registered positional",
                                  ["positional_registered"]),
    "heads and length": (r"(\d+) for heads and length", ["heads_length"]),
    "heads binding, CPU": (r"(\d+) for heads binding on the CPU",
                           ["heads_binding/multi_retrieval", "heads_binding/farthest_point"]),
    "heads binding, GPU": (r"heads binding on the CPU and (\d+) on the GPU",
                           ["heads_binding/multi_retrieval_accelerator"]),
    "scaling, GPU": (r"(\d+) for scaling on the GPU", ["scaling/accelerator"]),
    "first positional": (r"(\d+) for the first positional study", ["positional"]),
    "attention variants": (r"(\d+) for the first positional study\s+and attention variants",
                           ["attention_variants"]),
}


def _seeds_per_setting(study: str) -> set[int]:
  """The distinct seed counts of the settings (variant and learning rate) of a study's CSV."""
  seeds = collections.defaultdict(set)
  with open(RESULTS / study / "results.csv") as f:
    for row in csv.DictReader(f):
      seeds[(row["variant"], row.get("learning_rate"))].add(row["seed"])
  return {len(found) for found in seeds.values()}


@pytest.mark.parametrize("name", list(SEEDS))
def test_the_index_states_each_study_s_seeds_as_its_csv_counts_them(name):
  sentence = re.search(r"Seeds per setting:(.*?)\.\s", (RESULTS / "index.md").read_text(),
                       re.S).group(1)
  pattern, studies = SEEDS[name]
  stated = re.search(pattern, " ".join(sentence.split()))
  assert stated, f"the index no longer names {name!r} in its seeds sentence"
  for study in studies:
    assert _seeds_per_setting(study) == {int(stated.group(1))}, (name, study)


def test_every_study_with_a_csv_is_in_the_seeds_sentence():
  named = {study for _, studies in SEEDS.values() for study in studies}
  on_disk = {str(path.parent.relative_to(RESULTS)) for path in RESULTS.rglob("results.csv")}
  assert on_disk - named <= {"attention_variants/controls"}, on_disk - named  # its own page
