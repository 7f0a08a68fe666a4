#!/usr/bin/env bash
# Fully resident gpt-oss-20b decode before and after the fused decode-layer kernels (bench/NOTES.md), on the GPU
# machine, from the repository root there; BASE is a copy of the tree before them (app, bench, tests), "." or none
# for this tree alone:
#   bash bench/h200_resident.sh check BASE   # the CUDA tests; launches per layer and step time, before and after
#   bash bench/h200_resident.sh bench BASE   # decode at 100 % (model routing), before and after (BASE .: after)
#   bash bench/h200_resident.sh experts BASE # the expert kernels at T = 1 (float16 pairs swept; BASE's default)
# Results land in $OUT/results.tgz (the machine keeps nothing, and only a few files come back).
set -uo pipefail
phase=${1:?check, bench or experts}
base=$(cd "${2:-.}" && pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out/r"
export PYTHONUNBUFFERED=1
trap 'tar czf "$out/results.tgz" -C "$out" r' EXIT

if [ "$phase" = check ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/r/gpu.txt"
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_layer_cuda.py \
    tests/kernels/test_gpt_oss_experts_cuda.py tests/engine/test_cuda.py tests/engine/test_segmented_decode.py \
    tests/engine/test_device_misses_cuda.py > "$out/r/cuda-tests.log" 2>&1
  echo "pytest exit status $?" >> "$out/r/cuda-tests.log"
  tail -3 "$out/r/cuda-tests.log"
  python3 bench/profile_decode_step.py "$out/r/profile-after.json" --model gpt-oss-20b --layers 4 \
    --folder /tmp/g4 2>&1 | tee "$out/r/profile-after.log" | head -30
  [ "$base" = "$PWD" ] || (cd "$base" && python3 bench/profile_decode_step.py "$out/r/profile-before.json" \
    --model gpt-oss-20b --layers 4 --folder /tmp/g4 2>&1 | tee "$out/r/profile-before.log" | head -30)
  exit 0
fi

if [ "$phase" = bench ]; then
  python3 -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from bench.decode_gpt_oss import write_synthetic
write_synthetic(Path('/tmp/g20'), '20b')"
  for tree in "$PWD" $([ "$base" = "$PWD" ] || echo "$base"); do  # BASE "." (or none): after only
    name=$([ "$tree" = "$PWD" ] && echo after || echo before)
    (cd "$tree" && python3 bench/decode_gpt_oss.py "$out/r/decode-$name.json" --folder /tmp/g20 --fractions 1.0 \
      --routing model --new 128 --repeats 2 --llama-json bench/results/llama-cpp-gpt-oss-20b-2026-12-01.json \
      2>&1 | tee "$out/r/decode-$name.log" | grep -v '^{')
  done
  exit 0
fi
if [ "$phase" = experts ]; then
  python3 bench/kernel_gpt_oss_experts.py "$out/r/kernel-experts.json" --tokens 1 --formats mxfp4 --no-tile-sweeps \
    2>&1 | tee "$out/r/kernel-experts.log" | grep -v "^  sweep" | tail -30
  # BASE's default single-token op, timed by BASE's own bench in the same call
  [ "$base" = "$PWD" ] || (cd "$base" && python3 - "$out/r/kernel-experts-before.json" <<'PY'
import json, sys; sys.path.insert(0, ".")
import torch
from bench.kernel_gpt_oss_experts import check, copy_bandwidth, machine, make_arenas, pick_config, time_case
torch.manual_seed(0)
arenas = make_arenas(True)
case = {"machine": machine(), "command": "h200_resident.sh experts: BASE's run_experts at T = 1, its default",
        "config": repr(pick_config(4, True)), "check": check(arenas, 1, None)} | time_case(arenas, 1, None)
case["copy_bandwidth"] = copy_bandwidth()
case["floor_us"] = case["bytes_read"] / case["copy_bandwidth"] * 1e6
json.dump(case, open(sys.argv[1], "w"), indent=1)
kernels = {k: round(v, 1) for k, v in case["kernels_us"].items()}
print("before:", kernels, f"graph {case['graph_us']:.1f} us, floor {case['floor_us']:.1f} us")
PY
  )
  # the default single-token kernels' stall reasons (the third call's launches)
  cat > /tmp/one_token.py <<'PY'
import sys; sys.path.insert(0, ".")
import torch
from bench.kernel_gpt_oss_experts import ALPHA, HIDDEN, LIMIT, make_arenas, make_routing
from app.kernels.gpt_oss_experts_triton import run_experts
arenas, hidden = make_arenas(True), torch.randn(1, HIDDEN, device="cuda").bfloat16()
slots, weights = make_routing(1)
for _ in range(3):
    run_experts(hidden, arenas, slots, weights, LIMIT, ALPHA)
torch.cuda.synchronize()
PY
  ncu --clock-control none -k regex:"_gate_up_kernel|_down_kernel" --launch-skip 4 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis python3 /tmp/one_token.py > "$out/r/ncu.txt" 2>&1
  grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|Warp Cycles Per Issued" \
    "$out/r/ncu.txt" | head -24
  exit 0
fi
echo "unknown phase $phase" >&2
exit 2
