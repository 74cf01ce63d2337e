"""Learning-rate grid of the default model: 5 peak learning rates x 3 seeds, one compiled program.

  python -m experiments.sweep --config=configs/ablations/learning_rate.py \
      --workdir=workdir/ablations/learning_rate
  python -m experiments.sweep --config=configs/ablations/learning_rate.py:quick --workdir=/tmp/lr

The replicas of the one variant are its seeds times ``grid.learning_rate``; they train together,
vmapped (``--config.vmap_replicas=False`` trains them one after the other, for comparison). Each
(seed, learning rate) gets its own row in results.csv and metrics log; results.md gives mean +-
std over seeds per learning rate. The variants of the other ablations can carry the same grid, so
that each variant is compared at its own best learning rate rather than at one shared value.
"""

from configs.ablations import check_mode, sweep_config

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)


def get_config(mode=None):
  check_mode(mode, ("quick",))
  return sweep_config(mode, steps=600, eval_every=100, warmup=100,
                      variants=(("default", {}),), baseline="default",
                      learning_rates=LEARNING_RATES)
