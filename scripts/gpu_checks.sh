#!/usr/bin/env bash
# The GPU measurements of docs/performance.md in one command, for a short lease on one GPU:
#
#   bash scripts/gpu_checks.sh RESULTS_DIR [SECONDS] [PART ...]
#
# Most important first, each part within what is left of SECONDS (default 580): the GPU tests
# and the determinism check side by side (neither is timed), attention in bfloat16, the
# training step at accelerator sizes, attention in float16 (where JAX's Mosaic GPU kernel runs)
# and in float32, and the library's test files with whatever time remains. PART names choose
# some, in the order given: tests, attention_bf16, train_bf16, attention_f16, attention_f32,
# library_tests, and (not in the default list) study_heads, study_heads_length, study_scaling,
# study_scaling_init, study_positional, study_farthest_floor, study_variants, attention_tokamax,
# profile_bf16,
# flag_cost, flex, flex_mod, flex_fused, fused, fused_again, mfu. Logs and
# JSON go to RESULTS_DIR/results.tar.gz, rewritten after each part, so that a run cut short
# keeps what it finished. Python packages missing on the machine go in
# .whl/ as wheels (scripts/gpu_wheels.sh puts them there; modules they import but never use here
# in .whl/stubs/); they are installed to /tmp/site first.
set -u
results=${1:?usage: scripts/gpu_checks.sh RESULTS_DIR [SECONDS] [PART ...]}
deadline=$((SECONDS + ${2:-580}))
shift $(( $# < 2 ? $# : 2 ))
parts=("${@:-tests attention_bf16 train_bf16 attention_f16 attention_f32 library_tests}")
parts=(${parts[*]})
work=/tmp/gpu_checks && rm -rf "$work" && mkdir -p "$work" "$results"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$work/pip.log" 2>&1
  export PYTHONPATH=/tmp/site:$PWD:$PWD/.whl/stubs  # stubs: imported by a wheel, never used
else
  export PYTHONPATH=$PWD
fi

left() { echo $((deadline - SECONDS)); }
save() { tar czf "$results/results.tar.gz" -C "$work" . ; }
part() {  # part NAME CAP_SECONDS COMMAND...: runs COMMAND within min(CAP, time left - 10 s)
  local name=$1 cap=$2; shift 2
  local limit=$(( $(left) - 10 < cap ? $(left) - 10 : cap ))
  if (( limit < 15 )); then echo "== $name: skipped, ${limit}s left"; return; fi
  echo "== $name (limit ${limit}s, $(date -u +%H:%M:%S))"
  local started=$SECONDS
  timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - started))s"
  tail -n 40 "$work/$name.log"
  save
}

{ nvidia-smi; python3 - <<'PY'
import jax, jaxlib, flax, torch
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__, "torch",
      torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print(jax.devices(), getattr(jax.devices()[0], "compute_capability", None))
PY
  python3 -m pip list 2>/dev/null | grep -i -E "^(jax|flax|tokamax|torch|nvidia-cudnn|optax|orbax)"
} >"$work/env.log" 2>&1
head -n 30 "$work/env.log"; save

# Tests on the GPU, beside the determinism check (three settings, two processes each).
tests() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  ( timeout -k 5 $(( $(left) < 160 ? $(left) : 160 )) sh -c \
      "python3 scripts/determinism_check.py --steps 20 --json $work/determinism_default.json &&
       python3 scripts/determinism_check.py --steps 20 --size 'accelerator base' \
         --dtype bfloat16 --json $work/determinism_base_bf16.json" >"$work/determinism.log" 2>&1 ) &
  part gpu_tests 160 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_gpu.py \
    tests/test_accelerators.py tests/test_workdir.py -k "gpu or accelerator or sigkill"
  wait
  echo "== determinism"; cat "$work/determinism.log"; save
  unset XLA_PYTHON_CLIENT_PREALLOCATE
}

# Attention in bfloat16, forward and forward+backward, every kernel on this GPU and torch's.
attention_bf16() {
  part attention_bf16 220 python3 scripts/benchmark_attention.py --dtype bfloat16 --rounds 3 \
    --shapes 16,512,16,64 4,2048,16,64 4,2048,16,128 1,8192,16,64 1,16384,16,64 1,32768,16,64 \
    --methods default jax.nn:cudnn pallas:triton tokamax:mosaic tokamax:triton torch_sdpa \
    --json "$work/attention_bf16.json"
}

# Float16, where JAX's Mosaic GPU kernel runs (it takes no bfloat16).
attention_f16() {
  part attention_f16 90 python3 scripts/benchmark_attention.py --dtype float16 --rounds 3 \
    --shapes 16,512,16,64 4,2048,16,64 1,8192,16,64 1,32768,16,64 --methods default \
    pallas:mosaic tokamax:mosaic tokamax:triton torch_sdpa --json "$work/attention_f16.json"
}

# The trainer's step at accelerator sizes in bfloat16, beside the PyTorch twin.
train_bf16() {
  part train_bf16 170 python3 -m scripts.benchmark_train --dtype bfloat16 --rounds 3 \
    --seconds 0.5 --sizes default --accelerator-sizes --peak-tflops 989 \
    --methods attention_jax torch --json "$work/train_bf16.json"
}

# Attention in float32 (TF32 products in JAX, full float32 in torch).
attention_f32() {
  part attention_f32 100 python3 scripts/benchmark_attention.py --dtype float32 --rounds 3 \
    --shapes 16,512,16,64 4,2048,16,64 1,8192,16,64 --methods default xla chunked jax.nn \
    tokamax:triton torch_sdpa --json "$work/attention_f32.json"
}

# A study sized for one accelerator (study NAME CONFIG CAP), all replicas of a variant vmapped;
# its workdir goes in the results without finished variants' checkpoints, so that a sweep cut
# short resumes from it (extract it to .gpu_work/ here and carry that path).
study() {
  local name=$1 config=$2 cap=$3 workdir=.gpu_work/$1
  part "$name" "$cap" python3 -m experiments.sweep --config="$config" --workdir="$workdir"
  local unfinished=()  # their checkpoints travel; a finished variant's record is enough
  for variant in "$workdir"/variants/*/; do
    [ -e "$variant/result.json" ] || unfinished+=("$variant")
  done
  tar czf "$results/${name}_workdir.tar.gz" --exclude=checkpoints "$workdir"
  if (( ${#unfinished[@]} )); then
    tar czf "$results/${name}_checkpoints.tar.gz" "${unfinished[@]}"
  fi
}

# The heads study (D = 8 maxima, h 1 .. 32, 8 seeds x 3 learning rates).
study_heads() {
  study multi_retrieval_accelerator \
    configs/ablations/heads_binding.py:multi_retrieval_accelerator 420
}

# Heads and sequence length (D = 4 maxima, h 1-4 and 8, T 8-128; 10 seeds x 3 rates).
study_heads_length() {
  study heads_length_accelerator configs/ablations/heads_length.py:accelerator 420
}

# The scaling study (d_k 64, 256, 1024; 1/sqrt(d_k), none, QK-norm; 6 seeds x 5 rates).
study_scaling() {
  study scaling_accelerator configs/ablations/scaling.py:accelerator 400
}

# Scaling, tuned (d_k 64, 256, 1024; 1/sqrt(d_k), none, none with W_Q x d_k^-1/2, QK-norm with
# 1/d_k; 10 seeds x 3 rates, bracketed; 2000 steps).
study_scaling_init() {
  study scaling_init_accelerator configs/ablations/scaling_init.py:accelerator 500
}

# The positional study (even_pairs and order trained to length 64, tested at 2x, 4x and 8x;
# six encodings with randomized positions; 10 seeds x 2 rates).
study_positional() {
  study positional_accelerator configs/ablations/positional.py:accelerator 560
}

# farthest_point's floor (d = 32: one head at d_model 96 and at 32, learned temperature, the
# oracle's start, 32 rank-3 heads, depth at 4 points; 10 seeds x 2 rates, bracketed; 4000 steps).
study_farthest_floor() {
  study farthest_floor_accelerator configs/ablations/farthest_floor.py:accelerator 500
}

# The attention-variants study (8 arms, 2000 steps, 6 seeds x 4 rates).
study_variants() {
  study attention_variants_accelerator configs/ablations/attention_variants.py:accelerator 560
}

# Attention in bfloat16 with tokamax's kernels (its Mosaic GPU and Triton kernels).
attention_tokamax() {
  part attention_tokamax 120 python3 scripts/benchmark_attention.py --dtype bfloat16 --rounds 3 \
    --shapes 16,512,16,64 4,2048,16,64 1,8192,16,64 1,32768,16,64 --methods default \
    tokamax:mosaic tokamax:triton torch_sdpa --json "$work/attention_tokamax.json"
}

# Where the bfloat16 step at d_model 1024, T 2048 spends its time, and whether the GPU waits
# for the host between steps (the device streams' busy share); the trace is kept.
profile_bf16() {
  part profile_bf16 90 python3 -m scripts.profile_train --sizes "accelerator large" --steps 5 \
    --dtype bfloat16 --trace-dir "$work/trace" --json "$work/profile_bf16.json"
}

# What XLA's deterministic ops cost in float32 (no cuDNN attention there): the same step
# without, with, and again without the flag, each in its own process.
flag_cost() {
  local run
  for run in none deterministic none_again; do
    export XLA_FLAGS=""
    [ "$run" = deterministic ] && export XLA_FLAGS=--xla_gpu_deterministic_ops=true
    part "flag_cost_$run" 60 python3 -m scripts.benchmark_train --rounds 3 --seconds 0.5 \
      --sizes "accelerator base" --methods attention_jax --json "$work/flag_cost_$run.json"
  done
  unset XLA_FLAGS
}

# Score/mask functions (causal ALiBi as a score_mod and mask_mod) against torch's compiled
# FlexAttention on the same GPU, in bfloat16.
flex() {
  part flex 150 python3 scripts/benchmark_flex.py --dtype bfloat16 --lengths 2048 8192 \
    --rounds 3 --sparsity-length 8192 --documents 1 4 --json "$work/flex.json"
}

# The score_mod's own cost on the GPU: causal ALiBi against causal attention alone, forward and
# forward+backward in bfloat16, beside torch's compiled FlexAttention.
flex_mod() {
  part flex_mod 80 python3 scripts/benchmark_flex.py --dtype bfloat16 --lengths 2048 8192 \
    --rounds 3 --documents --json "$work/flex_mod.json"
}

# The fused Pallas-Triton kernel for score/mask functions: its tests compiled for the GPU, then
# its rows (the default and five other blocks:warps:stages) beside the chunked kernel and
# torch's compiled FlexAttention (bfloat16).
flex_fused() {
  part flex_fused_tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_pallas_gpu.py
  part flex_fused 300 python3 scripts/benchmark_flex.py --dtype bfloat16 \
    --lengths 2048 8192 16384 --rounds 3 --documents --json "$work/flex_fused.json" \
    --fused-configs 64:4:3 128:4:2 128x64:4:3 128x64:8:3 128:8:3
}

# The fused score/mask kernel compiled by Triton: its GPU tests (against the reference and the
# interpreter: mods, control flow, dropout, row maxima) beside cuDNN's with packed sequences, then
# its table (scripts/benchmark_fused.py: full, causal, ALiBi, dropout, documents, a window; the
# blockwise kernel and torch's compiled flex_attention beside it) and its tuning.
fused() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  part fused_tests 150 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_pallas_gpu.py \
    tests/test_gpu.py -k "on_a_gpu or cudnn or packed or tf32"
  unset XLA_PYTHON_CLIENT_PREALLOCATE
  part fused_table 420 python3 scripts/benchmark_fused.py --rounds 3 \
    --shapes 8192,64 16384,64 8192,128 2048,64 --tune 8192,64 8192,128 \
    --configs 64:4:2 64:4:3 128x64:4:3 128x64:8:3 128:4:2 128:8:3 --json "$work/fused.json"
}

# The fused kernel again, shorter: its compiled tests (trained tables, dropout), then the table
# at T 8192 and 2048 (head dim 64) and 8192 (head dim 128, with its tuning).
fused_again() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  part fused_tests 90 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_pallas_gpu.py \
    -k "on_a_gpu"
  unset XLA_PYTHON_CLIENT_PREALLOCATE
  part fused_table 300 python3 scripts/benchmark_fused.py --rounds 3 \
    --shapes 8192,64 2048,64 8192,128 --tune 8192,128 \
    --configs 64:4:2 64:4:3 128x64:4:3 128:8:3 --json "$work/fused.json"
}

# Model FLOPs utilisation in bfloat16 at d_model 1024 with heads of 64 and of 128, and at
# d_model 2048, beside the PyTorch twin; where the wider heads' step spends its time.
mfu() {
  part mfu 220 python3 -m scripts.benchmark_train --dtype bfloat16 --rounds 3 --seconds 0.5 \
    --sizes "accelerator large" "accelerator large dk128" "accelerator xl" --peak-tflops 989 \
    --methods attention_jax torch --json "$work/mfu.json"
  part profile_dk128 80 python3 -m scripts.profile_train --sizes "accelerator large dk128" \
    --steps 5 --dtype bfloat16 --json "$work/profile_dk128.json"
}

# The library's test files, as far as the time goes.
library_tests() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  part library_tests 600 python3 -m pytest -q -n 8 -p no:cacheprovider \
    $(grep -v "^#" .ci/library_tests.txt)
  unset XLA_PYTHON_CLIENT_PREALLOCATE
}

for name in "${parts[@]}"; do "$name"; done
echo "== done, $(left)s left"
