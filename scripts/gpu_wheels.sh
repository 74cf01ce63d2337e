#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with what scripts/gpu_checks.sh installs on a GPU machine that has
# jax, flax, optax, orbax, chex, torch and pytest but no package index: the experiment stack's
# other packages and tokamax (a benchmark peer), as Python 3.12 x86-64 wheels, at the versions of
# requirements.txt. Run it here, where pip reaches the registries:
#
#   bash scripts/gpu_wheels.sh
set -eu
cd "$(dirname "$0")/.."
mkdir -p .whl/stubs/xprof/cli
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$@"
}
# The experiment stack beyond the machine's packages, and what tensorflow-datasets needs.
download ml-collections==1.1.0 tensorflow-datasets==4.9.10 array-record==0.8.6 \
  importlib-resources==7.1.0 tensorboardX==2.6.5 dm-tree==0.1.10 docstring_parser==0.18.0 \
  googleapis-common-protos==1.76.0 immutabledict==4.3.1 simple-parsing==0.1.9 \
  tensorflow-metadata==1.21.0 termcolor==3.3.0 toml==0.10.2
python3 -m pip wheel -q --no-deps promise==2.3 -w .whl  # published as a source archive only
# tokamax and its needs; xprof (32 MB, its profiler) is imported at import time but not used by
# attention, so a stub stands in for it.
download tokamax==0.0.17 einshape==1.0 pydantic==2.14.4 pydantic_core==2.50.5 qwix==0.1.8 \
  annotated-types==0.8.0 typing-inspection==0.4.5
download matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 \
  kiwisolver==1.5.1 pillow==13.0.0 pyparsing==3.3.3 python-dateutil==4.0.0 six==1.17.0 \
  tqdm==4.70.1
touch .whl/stubs/xprof/__init__.py .whl/stubs/xprof/cli/__init__.py
printf 'def get_kernel_stats_tool(*args, **kwargs):\n  raise NotImplementedError("a stub")\n' \
  > .whl/stubs/xprof/cli/tools.py
du -sh .whl
