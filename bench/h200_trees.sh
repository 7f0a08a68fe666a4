#!/usr/bin/env bash
# The kernel benchmarks of this tree and of earlier or other trees in one device call, on the GPU machine, from the
# repository root there:
#   bash bench/h200_trees.sh [TREE.tar ...]   # each TREE.tar: git archive <commit> app tests bench tools
# This tree first runs its CUDA tests of the kernels and engines (TESTS overrides the list; TESTS=none skips them).
# Then this tree and each tar, in turn, run the PHASES (default "experts prefill"): experts, the MXFP4 one-token
# experts (bench/kernel_gpt_oss_experts.py at T = 1 with its float16-pair sweep); prefill, the FP8 dense prefill
# sweep (bench/kernel_fp8_linear.py --prefill); one_token, the FP8 and bf16 GLU experts at one token
# (bench/kernel_one_token.py --experts: the tree's tile sweep); one_token_defaults, the FP8 dense products at one
# token (q/k/v, o, the shared expert) and the experts, each at the tree's default tiles alone. Last, unless NCU=0,
# Nsight Compute on this tree's one-token MXFP4 experts and FP8 GLU experts (memory tables included: L1 wavefronts,
# sectors a request). About 1.5 minutes a tree for the default phases, 2-3 for one_token: a call holds 10 minutes.
# THIS=0 leaves this tree out of the phases; NAME (default "this") names its result files, so that two runs of this
# tree under different settings (say MOECHAT_FP8_AS_BYTES=1) keep both.
# Results land in $OUT/results.tgz (the machine keeps nothing, and only a few files come back).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out/r"
export PYTHONUNBUFFERED=1
trap 'tar czf "$out/results.tgz" -C "$out" r' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/r/gpu.txt"

tests=${TESTS:-tests/kernels/test_gpt_oss_experts_cuda.py tests/kernels/test_decode_layer_cuda.py
  tests/kernels/test_fp8_linear_cuda.py tests/kernels/test_glu_experts_cuda.py tests/engine/test_glm_cuda.py
  tests/engine/test_cuda.py}
if [ "$tests" != none ]; then
  # shellcheck disable=SC2086
  timeout 240 python3 -m pytest -q -p no:cacheprovider $tests > "$out/r/cuda-tests.log" 2>&1
  echo "pytest exit status $?" >> "$out/r/cuda-tests.log"
  tail -4 "$out/r/cuda-tests.log"
fi
phases=" ${PHASES:-experts prefill} "

this=${NAME:-this}
trees=()
[ "${THIS:-1}" = 0 ] || trees+=("$PWD")
for tar in "$@"; do
  name=$(basename "$tar" .tar)
  mkdir -p "/tmp/trees/$name" && tar -xf "$tar" -C "/tmp/trees/$name"
  trees+=("/tmp/trees/$name")
done
for tree in "${trees[@]}"; do
  name=$([ "$tree" = "$PWD" ] && echo "$this" || basename "$tree")
  echo "== $name"
  if [[ $phases == *" experts "* ]]; then
    (cd "$tree" && timeout 150 python3 bench/kernel_gpt_oss_experts.py "$out/r/experts-$name.json" --tokens 1 \
      --formats mxfp4 --no-tile-sweeps > "$out/r/experts-$name.log" 2>&1)
    grep "T=  1\|T=1 " "$out/r/experts-$name.log" | sed 's/LaunchConfig(pairs_per_tile=1, gate_up=//' | cut -c1-300
  fi
  if [[ $phases == *" prefill "* ]]; then
    (cd "$tree" && timeout 150 python3 bench/kernel_fp8_linear.py "$out/r/prefill-$name.json" --prefill \
      > "$out/r/prefill-$name.log" 2>&1)
    grep "default" "$out/r/prefill-$name.log" | cut -c1-200
  fi
  if [[ $phases == *" one_token "* ]]; then
    (cd "$tree" && timeout 200 python3 bench/kernel_one_token.py "$out/r/one-token-$name.json" --experts \
      > "$out/r/one-token-$name.log" 2>&1)
    grep "experts" "$out/r/one-token-$name.log" | cut -c1-260
  fi
  if [[ $phases == *" one_token_defaults "* ]]; then
    (cd "$tree" && timeout 200 python3 bench/kernel_one_token.py "$out/r/one-token-defaults-$name.json" --defaults \
      > "$out/r/one-token-defaults-$name.log" 2>&1)
    grep " us \|experts" "$out/r/one-token-defaults-$name.log" | cut -c1-260
  fi
done
[ "${NCU:-1}" = 0 ] && exit 0

# two launches a call match: skip 4 profiles the third MXFP4 call, skip 10 the third GLU call
cat > /tmp/experts_one_token.py <<'PY'
import sys; sys.path.insert(0, ".")
import torch
from app.kernels.expert_table import columns, slot_table
from app.kernels.glu_experts_one_token import run_one_token
from app.kernels.glu_experts_triton import Projection
from app.kernels.gpt_oss_experts_triton import run_experts
from bench import kernel_glu_experts as glu
from bench import kernel_gpt_oss_experts as gpt_oss
arenas, hidden = gpt_oss.make_arenas(True), torch.randn(1, gpt_oss.HIDDEN, device="cuda").bfloat16()
slots, weights = gpt_oss.make_routing(1)
for _ in range(3):
    run_experts(hidden, arenas, slots, weights, gpt_oss.LIMIT, gpt_oss.ALPHA)
del arenas
arenas = glu.make_arenas("fp8-per-channel")
projections = tuple(Projection.of(arenas, name, None) for name in ("gate_proj", "up_proj", "down_proj"))
hidden, (slots, weights) = torch.randn(1, glu.HIDDEN, device="cuda").bfloat16(), glu.make_routing(1)
for _ in range(3):
    run_one_token(hidden, projections, slot_table(arenas), slots, weights, columns(arenas))
torch.cuda.synchronize()
PY
for skip in 4 10; do
  timeout 200 ncu --clock-control none -k regex:"_gate_up_kernel|_down_kernel" --launch-skip $skip --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    python3 /tmp/experts_one_token.py > "$out/r/ncu-skip-$skip.txt" 2>&1
done
grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|L1/TEX Cache Throughput|Achieved Occupancy|Registers Per" \
  "$out"/r/ncu-skip-*.txt | cut -c1-150
