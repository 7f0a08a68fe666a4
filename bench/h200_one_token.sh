#!/usr/bin/env bash
# The single-token kernels (rows times one vector) on the GPU machine, from the repository root there:
#   bash bench/h200_one_token.sh kernels   # their CUDA tests, then bench/kernel_one_token.py (sweeps)
#   bash bench/h200_one_token.sh registers # bench/kernel_one_token.py --registers (the defaults, registers capped)
#   bash bench/h200_one_token.sh decode    # GLM-4.5-Air-FP8 decoding fully resident, the engine's CUDA tests,
#                                          # GLM's step profile; gpt-oss-120b and -20b fully resident (MODELS),
#                                          # each way of stepping in STEPS (ahead; e.g. ahead,in-turn); PROFILE=0
#                                          # skips the profile; BASE=tree.tar (git archive of an earlier commit's
#                                          # app, tests and bench) first decodes GLM the same way in that tree
#   bash bench/h200_one_token.sh mla       # GLM-4.7-Flash (latent attention): the decode-layer and GLM CUDA tests,
#                                          # its 4-layer step profile, decoding fully resident (BASE: one or more
#                                          # tars as above, each decoded first in its own folder)
#   bash bench/h200_one_token.sh targets   # the issue's kernel targets on this card in one call: the MXFP4 one-token op
#                                          # and its bounds (bench/mxfp4_one_token_bounds.py), the FP8 prefill products
#                                          # against bf16 cuBLAS (bench/kernel_fp8_linear.py --prefill), the MXFP4
#                                          # one-token rows and warps a program (bench/kernel_gpt_oss_experts.py at T = 1)
#   bash bench/h200_one_token.sh profiles  # the 4-layer step profiles (launches a layer, graph step time) of BASE's
#                                          # tree and this one, alternating for ROUNDS (2), of PROFILE_MODELS (glm
#                                          # glm-4.7-flash)
#   bash bench/h200_one_token.sh spec      # speculation on gpt-oss-20b fully resident (bench/spec_decode.py: off and the
#                                          # cost-aware policy at ACCEPTANCE, 0.6,0.9; fixed BLOCKS, none) in BASE's
#                                          # tree and this one,
#                                          # alternating for ROUNDS (2); gpt-oss-20b's 4-layer verify of 8 positions
#                                          # and decode step profiled; the speculation and run-ahead CUDA tests
# Results land in $OUT (the machine keeps nothing).
set -uo pipefail
phase=${1:?kernels, registers, decode, mla, targets, profiles or spec}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [ "$phase" = kernels ]; then
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_linear_cuda.py tests/kernels/test_glu_experts_cuda.py \
    > "$out/cuda-tests-kernels.log" 2>&1
  echo "pytest exit status $?" >> "$out/cuda-tests-kernels.log"
  tail -4 "$out/cuda-tests-kernels.log"
  python3 bench/kernel_one_token.py "$out/kernel-one-token.json" 2>&1 | tee "$out/kernel-one-token.log"
  # the default single-token kernels' stall reasons: o_proj with its residual, and the experts
  cat > /tmp/one_token.py <<'PY'
import sys; sys.path.insert(0, ".")
import torch
from app.kernels.expert_table import columns, slot_table
from app.kernels.fp8_linear_triton import run_one_token
from app.kernels.glu_experts_one_token import run_one_token as experts_one_token
from app.kernels.glu_experts_triton import Projection
from bench.kernel_fp8_linear import make_weight
from bench.kernel_glu_experts import HIDDEN, make_arenas, make_routing
weight, scale = make_weight(4096, 12288, None)
x, residual = torch.randn(1, 12288, device="cuda").bfloat16(), torch.randn(1, 4096, device="cuda").bfloat16()
arenas = make_arenas("fp8-per-channel")
projections = tuple(Projection.of(arenas, name, None) for name in ("gate_proj", "up_proj", "down_proj"))
hidden, (slots, weights) = torch.randn(1, HIDDEN, device="cuda").bfloat16(), make_routing(1)
for _ in range(3):
    run_one_token(x, weight, scale, None, False, residual)
    experts_one_token(hidden, projections, slot_table(arenas), slots, weights, columns(arenas))
torch.cuda.synchronize()
PY
  ncu --clock-control none -k regex:"_one_token_kernel|_gate_up_kernel|_down_kernel" --launch-skip 6 --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis python3 /tmp/one_token.py > "$out/ncu-one-token.txt" 2>&1
  grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|Warp Cycles Per Issued" \
    "$out/ncu-one-token.txt" | head -30
  exit 0
fi

if [ "$phase" = registers ]; then
  python3 bench/kernel_one_token.py "$out/kernel-one-token-registers.json" --registers 2>&1 \
    | tee "$out/kernel-one-token-registers.log"
  exit 0
fi

steps=${STEPS:-ahead}
if [ "$phase" = mla ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_layer_cuda.py tests/engine/test_glm_cuda.py \
    > "$out/cuda-tests-mla.log" 2>&1
  echo "pytest exit status $?" >> "$out/cuda-tests-mla.log"
  tail -4 "$out/cuda-tests-mla.log"
  timeout 120 python3 bench/profile_decode_step.py "$out/profile-glm-4.7-flash.json" --model glm-4.7-flash --layers 4 \
    --folder /tmp/flash4 2>&1 | tee "$out/profile-glm-4.7-flash.log" | head -30
  flash="--model glm-4.7-flash --folder /tmp/flash --fractions 1.0 --routing uniform --misses device --new 64 --repeats 2"
  # shellcheck disable=SC2086
  for tar in ${BASE:-}; do  # one or more earlier trees, each decoded in its own folder
    name=$(basename "$tar" .tar)
    mkdir -p "/tmp/trees/$name" && tar -xf "$tar" -C "/tmp/trees/$name"
    # shellcheck disable=SC2086
    (cd "/tmp/trees/$name" && timeout 170 python3 bench/decode_glm.py "$out/decode-glm-4.7-flash-$name.json" $flash \
      2>&1 | tee "$out/decode-glm-4.7-flash-$name.log" | grep -v '^{')
  done
  # shellcheck disable=SC2086
  timeout 150 python3 bench/decode_glm.py "$out/decode-glm-4.7-flash.json" $flash 2>&1 \
    | tee "$out/decode-glm-4.7-flash.log" | grep -v '^{'
  exit 0
fi
if [ "$phase" = targets ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt"
  timeout 120 python3 bench/mxfp4_one_token_bounds.py "$out/mxfp4-one-token-bounds.json" 2>&1 | grep -v '^{' \
    | tee "$out/mxfp4-one-token-bounds.log"
  timeout 200 python3 bench/kernel_fp8_linear.py "$out/kernel-fp8-linear-prefill.json" --prefill 2>&1 | grep -v '^{' \
    | tee "$out/kernel-fp8-linear-prefill.log" | tail -30
  timeout 200 python3 bench/kernel_gpt_oss_experts.py "$out/kernel-gpt-oss-experts-t1.json" --tokens 1 \
    --formats mxfp4 --no-tile-sweeps 2>&1 | tee "$out/kernel-gpt-oss-experts-t1.log" | grep "T=1"
  exit 0
fi
if [ "$phase" = profiles ]; then  # A/B of the 4-layer step (launches, graph time): BASE's tree and this one, alternating
  mkdir -p /tmp/base && tar -xf "${BASE:?a tar of the earlier tree}" -C /tmp/base
  for round in $(seq "${ROUNDS:-2}"); do
    for tree in /tmp/base "$PWD"; do
      name=$([ "$tree" = "$PWD" ] && echo after || echo before)
      for model in ${PROFILE_MODELS:-glm glm-4.7-flash}; do
        (cd "$tree" && timeout 100 python3 bench/profile_decode_step.py "$out/profile-$model-$name-$round.json" \
          --model "$model" --layers 4 --folder "/tmp/$model-4" 2>&1 | tee "$out/profile-$model-$name-$round.log" \
          | grep "graph step" | sed "s/^/$model $name $round: /")
      done
    done
  done
  exit 0
fi
if [ "$phase" = spec ]; then
  mkdir -p /tmp/base && tar -xf "${BASE:?a tar of the earlier tree}" -C /tmp/base
  for round in $(seq "${ROUNDS:-2}"); do
    for tree in /tmp/base "$PWD"; do
      name=$([ "$tree" = "$PWD" ] && echo after || echo before)
      (cd "$tree" && timeout 150 python3 bench/spec_decode.py "$out/spec-decode-20b-$name-$round.json" --model 20b \
        --prompt 256 --new 256 --repeats 2 --fractions 1.0 --acceptance "${ACCEPTANCE:-0.6,0.9}" --blocks "${BLOCKS:-}" \
        --folder /tmp/spec 2>&1 | tee "$out/spec-decode-20b-$name-$round.log" | grep -v '^{' | sed "s/^/$name $round: /")
    done
  done
  for tokens in 8 1; do
    timeout 100 python3 bench/profile_decode_step.py "$out/profile-gpt-oss-20b-tokens-$tokens.json" --model gpt-oss-20b \
      --layers 4 --tokens "$tokens" --folder /tmp/g20-4 2>&1 | tee "$out/profile-gpt-oss-20b-tokens-$tokens.log" | head -20
  done
  # the spec folder's files together: apart, the device's pytest did not load its conftest for the later one
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py tests/engine/test_runs_ahead.py \
    tests/kernels/test_gpt_oss_experts_cuda.py tests/kernels/test_decode_layer_cuda.py tests/engine/spec/test_spec_cuda.py \
    tests/engine/spec/test_plain_steps_ahead.py > "$out/cuda-tests-spec.log" 2>&1
  echo "pytest exit status $?" >> "$out/cuda-tests-spec.log"
  tail -4 "$out/cuda-tests-spec.log"
  exit 0
fi
if [ "$phase" = decode ]; then
  if [ -n "${BASE:-}" ]; then  # the earlier commit on the same checkpoint, in the same call: an A/B
    mkdir -p /tmp/base && tar -xf "$BASE" -C /tmp/base
    (cd /tmp/base && timeout 200 python3 bench/decode_glm.py "$out/decode-glm-base.json" --folder /tmp/glm \
      --fractions 1.0 --routing uniform --misses device --new 64 --repeats 2 --steps "$steps" 2>&1 \
      | tee "$out/decode-glm-base.log" | grep -v '^{')
  fi
  timeout 200 python3 bench/decode_glm.py "$out/decode-glm.json" --folder /tmp/glm --fractions 1.0 --routing uniform \
    --misses device --new 64 --repeats 2 --steps "$steps" 2>&1 | tee "$out/decode-glm.log" | grep -v '^{'
  rm -rf /tmp/glm
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/engine/test_glm_cuda.py tests/kernels/test_decode_layer_cuda.py \
    tests/kernels/test_glu_experts_cuda.py \
    tests/engine/test_cuda.py > "$out/cuda-tests-engine.log" 2>&1
  echo "pytest exit status $?" >> "$out/cuda-tests-engine.log"
  tail -4 "$out/cuda-tests-engine.log"
  if [ "${PROFILE:-1}" = 1 ]; then
    timeout 80 python3 bench/profile_decode_step.py "$out/profile-glm.json" --model glm --layers 4 --folder /tmp/glm4 \
      2>&1 | tee "$out/profile-glm.log" | head -40
  fi
  for model in ${MODELS-120b 20b}; do
    timeout 240 python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-$model.json" --model "$model" \
      --folder "/tmp/g$model" --fractions 1.0 --routing model --misses device --new 128 --repeats 2 --steps "$steps" 2>&1 \
      | tee "$out/decode-gpt-oss-$model.log" | grep -v '^{'
    rm -rf "/tmp/g$model"
  done
  exit 0
fi
echo "unknown phase $phase" >&2
exit 2
