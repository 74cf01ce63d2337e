"""The numbers the results pages state about their studies, against the CSVs the studies wrote:
the seeds per setting of docs/results/index.md, counted in every results.csv, and each page's
wall time, against the sum of its arms' own timing (the ``seconds`` of their rows)."""

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
    "causal positions": (r"(\d+) for [^;]*positions in a causal model",
                         ["positional_causal/order", "positional_causal/even_pairs",
                          "positional_causal/randomized"]),
    "scale apart from the optimiser": (r"(\d+) for [^;]*the scale apart from the optimiser",
                                      ["scale_optimiser/adam_dk16", "scale_optimiser/adam_dk64",
                                       "scale_optimiser/sgd_dk16", "scale_optimiser/mup_dk16",
                                       "scale_optimiser/mup_dk64", "scale_optimiser/mup_dk256",
                                       "scale_optimiser/sgd_unscaled_dk16",
                                       "scale_optimiser/sgd_unscaled_dk64"]),
    "SGD pilots": (r"(\d+) for the SGD pilots", ["scale_optimiser/sgd_pilot_inv_sqrt",
                                                 "scale_optimiser/sgd_pilot_none",
                                                 "scale_optimiser/sgd_pilot_high"]),
    "heads against width": (r"(\d+) for [^;]*heads against width",
                            ["heads_width/d32", "heads_width/d64", "heads_width/d64_T64_h2",
                             "heads_width/d64_T64_h4", "heads_width/d128_T8",
                             "heads_width/d128_T32_h2", "heads_width/d128_T32_h4",
                             "heads_width/farthest_point"]),
    "heads and length": (r"(\d+) for heads and length", ["heads_length"]),
    "heads binding, CPU": (r"(\d+) for heads binding on the CPU",
                           ["heads_binding/multi_retrieval_10seeds",
                            "heads_binding/farthest_point_10seeds"]),
    "heads binding, first CPU runs": (r"on the CPU \((\d+) in its first runs\)",
                                      ["heads_binding/multi_retrieval",
                                       "heads_binding/farthest_point"]),
    "heads binding, GPU": (r"first runs\) and (\d+) on the GPU",
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


# Each page's "Wall time" line: a pattern whose groups are the durations it states, their units,
# and for each of the study's CSVs (or groups of CSVs) the groups whose sum is its time.
M, S = 1, 1 / 60  # minutes per unit
WALL_TIMES = {
    "heads": (r"([\d.]+) minutes", (M,), [((1,), ["heads"])]),
    "scaling": (r"([\d.]+) minutes \(1475 s, the command's\), and ([\d.]+) minutes for the added",
                (M, M), [((1, 2), ["scaling"])]),
    "heads_length": (r"([\d.]+) minutes \(582 s\)", (M,), [((1,), ["heads_length"])]),
    "attention_variants": (r"([\d.]+) minutes", (M,), [((1,), ["attention_variants"])]),
    "positional": (r"([\d.]+) minutes", (M,), [((1,), ["positional"])]),
    "farthest_floor": (r"([\d.]+) minutes", (M,), [((1,), ["farthest_floor"])]),
    "positional_registered": (r"([\d.]+) minutes", (M,), [((1,), ["positional_registered"])]),
    "scaling_init": (r"([\d.]+) minutes", (M,), [((1,), ["scaling_init"])]),
    "heads_binding": (r"`multi_retrieval` ([\d.]+) minutes, `farthest_point` ([\d.]+) minutes",
                      (M, M), [((1,), ["heads_binding/multi_retrieval"]),
                               ((2,), ["heads_binding/farthest_point"])]),
    "head_variants": (r"mqar ([\d.]+) minutes \(1330 s\); the added mqar rate trained in (\d+) s"
                      r".*`order_4` ([\d.]+) minutes and `order_16` ([\d.]+) minutes",
                      (M, S, M, M), [((1, 2), ["head_variants/mqar"]),
                                     ((3,), ["head_variants/order_4"]),
                                     ((4,), ["head_variants/order_16"])]),
}


def _arm_minutes(study: str) -> float:
  """Minutes in the arms' programs: each arm (or bracketing run) trains its replicas as one
  program and writes that program's time in every one of its rows."""
  seconds = collections.defaultdict(set)
  with open(RESULTS / study / "results.csv") as f:
    for row in csv.DictReader(f):
      if row["seconds"]:
        seconds[row["variant"]].add(float(row["seconds"]))
  return sum(sum(times) for times in seconds.values()) / 60


@pytest.mark.parametrize("page", list(WALL_TIMES))
def test_each_page_s_wall_time_is_its_arms_time(page):
  """Within 5% (or half a minute): the command's time adds data generation and reports to the
  arms' programs, which is all the CSV times."""
  text = " ".join((RESULTS / f"{page}.md").read_text().split())
  line = re.search(r"\*\*Wall time\*\*: (.*?)- \*\*", text).group(1)
  pattern, units, parts = WALL_TIMES[page]
  stated = re.search(pattern, line)
  assert stated, f"{page}.md's wall time no longer reads as the test expects: {line!r}"
  assert len(units) == len(stated.groups())
  for indices, studies in parts:
    minutes = sum(float(stated.group(i)) * units[i - 1] for i in indices)
    in_arms = sum(_arm_minutes(study) for study in studies)
    assert abs(minutes - in_arms) <= max(0.5, 0.05 * in_arms), (page, studies, minutes, in_arms)


def test_head_variants_grouping_check_is_what_its_page_says():
  """head_variants.md: order_4 in one program per arm and in programs of 10 replicas gave every
  run the same test loss to the last bit (160 runs)."""
  def rows(name):
    with open(RESULTS / "head_variants" / "grouping" / name) as f:
      return {(r["variant"], r["seed"], r["learning_rate"]): r["eval_loss"]
              for r in csv.DictReader(f)}
  together, by_rate = rows("one_program.csv"), rows("programs_of_10.csv")
  assert len(together) == 160 and together == by_rate
  assert "same test loss to the last bit" in " ".join(
      (RESULTS / "head_variants.md").read_text().split())
