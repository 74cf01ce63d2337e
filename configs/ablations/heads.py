"""Heads on recall, a control: num_heads 1 .. 32 at d_model 64 (d_k = 64 .. 2) on multi-query
associative recall, which one head solves (Arora et al. 2023), each head count at its own best
learning rate. configs/ablations/heads_binding.py tests the head count where theory says it binds.

  python -m experiments.sweep --config=configs/ablations/heads.py --workdir=workdir/ablations/heads
  python -m experiments.sweep --config=configs/ablations/heads.py:quick --workdir=/tmp/heads

Question: at a fixed width, does splitting attention into more, narrower heads help, and where
does it start to hurt? Task: `mqar` (configs/mqar.py), a target at every query, where every
query's lookup has to match its key against all listed keys. Expected from the literature:
Vaswani et al. (2017) Table 3 (A) find 1 head 0.9 BLEU below the best (8 heads at d_k 64) and
32 heads (d_k 16) 0.4 below; Bhojanapalli et al. (2020) argue that a head whose d_k is below what
the lookup needs cannot represent it (the low-rank bottleneck), so the narrowest heads should
fail first. Each head count runs over a learning-rate grid x 3 seeds; the report gives the best
learning rate per head count with its interval, the steps to 90% accuracy and the learning-rate
curves.

`:quick` is a smoke test of the pipeline (100 steps, no head count leaves the plateau). The
results, with their runtime and provenance: docs/results/heads.md.
"""

from configs import mqar
from configs.ablations import check_mode, sweep_config

# 64 heads (d_k = 1) is not among them: RoPE, the encoding this task learns with (configs/mqar.py),
# rotates pairs of dimensions, so d_k = 2 is the narrowest head it allows; the config check
# refuses d_k = 1 with it. With the paper's sinusoidal encoding, which allows d_k = 1, the task
# does not leave its plateau in this budget (docs/results/heads.md, "Why RoPE").
HEADS = (1, 2, 4, 8, 16, 32)
LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2)

# Seeds per arm: enough for the exact tests of the report to reach p < 0.05 after Holm over
# the study's comparisons (experiments/statistics.py, smallest_p).
NUM_SEEDS = 10


def get_config(mode=None):
  check_mode(mode, ("quick",))
  rates = LEARNING_RATES[1:3] if mode == "quick" else LEARNING_RATES  # quick: a smoke test
  return sweep_config(mode, steps=1000, eval_every=100, warmup=100, base=mqar,
                      baseline=f"heads_{HEADS[0]}", test="time_to_solve", variants=(
                          (f"heads_{n}", {"model": {"num_heads": n}}) for n in HEADS),
                      seeds=NUM_SEEDS, learning_rates=rates)
