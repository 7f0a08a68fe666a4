#!/usr/bin/env bash
# One device session of the offloaded-decode protocol (performance.md), on the GPU machine, from the repository
# root there, with ../shared/peer copied into .peer (carried):
#   bash bench/h200_session.sh start   # llama.cpp built, converted and benched in the background; the synthetic
#                                      # gpt-oss-20b written; the CUDA tests (TESTS: which); with RESIDENT=1 this
#                                      # engine fully resident (before llama.cpp's benches, which wait for it)
#   bash bench/h200_session.sh llama   # waits for llama.cpp's benches and copies their JSON
#   bash bench/h200_session.sh bench   # waits for llama.cpp, then this engine on the same checkpoint (20b, the
#                                      # three routings, misses served on the device); with RATE=1 first the CPU
#                                      # expert kernels alone (bench/cpu_expert_rate.py)
#   bash bench/h200_session.sh tier    # the CPU expert tier: its tests, bench/cpu_expert_rate.py and the decode
#                                      # runs, against llama.cpp's figures of an earlier call (LLAMA_JSON)
#   bash bench/h200_session.sh glm     # GLM-4.5-Air-FP8 (uniform routing), misses served on the device
# Results land in $OUT (the machine keeps nothing): decode-*.json, llama-*.json, logs. Settings (environment):
# NCMOE, llama.cpp's -ncmoe list (0,12,18,24); FRACTIONS (1.0,0.5,0.25,0.1), ROUTING (model,trace,uniform) and
# CPU_THREADS (0; the CPU expert tier's threads, e.g. 0,15) of this engine's runs; FIRST_LOOK (1) the start phase's
# look at 25 % uniform while llama.cpp builds.
set -uo pipefail
phase=${1:?start or bench}
out=${OUT:-/tmp/out}
ncmoe=${NCMOE:-0,12,18,24}; fractions=${FRACTIONS:-1.0,0.5,0.25,0.1}; routing=${ROUTING:-model,trace,uniform}
cpu_threads=${CPU_THREADS:-0}
tests=${TESTS:-tests/engine/test_device_misses_cuda.py tests/engine/test_cuda.py tests/engine/test_cpu_tier_cuda.py \
  tests/engine/test_glm_cuda.py tests/engine/spec/test_spec_cuda.py tests/engine/test_segmented_decode.py \
  tests/kernels/test_gpt_oss_experts_cuda.py tests/kernels/test_glu_experts_cuda.py tests/kernels/test_fp8_linear_cuda.py}

build_cpu_kernels() {  # the CPU expert kernels, as `pip install -e .` builds them (setup.py), for this Python
  gcc -O3 -std=c11 -fopenmp -shared -fPIC -o "app/kernels/cpu/_experts$(python3-config --extension-suffix)" \
    app/kernels/cpu/*.c -lm
}

write_checkpoint() {  # the synthetic gpt-oss-20b that this engine and llama.cpp both read
  python3 -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from bench.decode_gpt_oss import write_synthetic
write_synthetic(Path('/tmp/g20'), '20b')" > "$out/checkpoint.log" 2>&1
}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [ "$phase" = start ]; then
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > "$out/gpu.txt"
  lscpu > "$out/cpu.txt"
  build_cpu_kernels
  cp -r .peer /tmp/peer
  # llama.cpp first builds (CPU-bound) while the checkpoint is written and the tests run; it is benched once
  # both are done, alone on the machine
  setsid nohup env NCMOE="$ncmoe" bash -c '
    bash /tmp/peer/build_llamacpp.sh /tmp/llama > /tmp/llama-build.log 2>&1
    while [ ! -f /tmp/g20.done ] || [ ! -f /tmp/tests.done ]; do sleep 2; done
    bash /tmp/peer/convert.sh /tmp/llama /tmp/g20 /tmp/g20.gguf > /tmp/llama-convert.log 2>&1
    /tmp/llama/bin/llama-bench -m /tmp/g20.gguf -ngl 99 -ncmoe $NCMOE -p 0 -n 128 -d 512 -r 3 -t 16 \
      -o json > /tmp/llama-tg.json 2> /tmp/llama-tg.log
    /tmp/llama/bin/llama-bench -m /tmp/g20.gguf -ngl 99 -ncmoe $NCMOE -p 512 -n 0 -r 3 -t 16 \
      -o json > /tmp/llama-pp.json 2> /tmp/llama-pp.log
    touch /tmp/llama.done
  ' > /tmp/peer-job.log 2>&1 < /dev/null &
  write_checkpoint && touch /tmp/g20.done
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider $tests 2>&1 | tee "$out/cuda-tests.log" | tail -25
  if [ "${FIRST_LOOK:-1}" = 1 ]; then  # the offloaded step while llama.cpp still builds (the build loads the CPU)
    python3 bench/decode_gpt_oss.py "$out/first-look.json" --folder /tmp/g20 --fractions 0.25 --routing uniform \
      --cpu-threads "$cpu_threads" --new 64 --repeats 2 2>&1 | tee "$out/first-look.log" | grep -v '^{'
  fi
  if [ "${RESIDENT:-0}" = 1 ]; then  # every expert on the GPU: decode after the 512-token prompt and its TTFT
    python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-20b-resident.json" --folder /tmp/g20 --fractions 1.0 \
      --routing model,trace --misses device --new 128 --repeats 2 2>&1 | tee "$out/resident.log" | grep -v '^{'
  fi
  touch /tmp/tests.done
  tail -3 /tmp/llama-build.log
  exit 0
fi

if [ "$phase" = llama ]; then
  while [ ! -f /tmp/llama.done ]; do sleep 5; done
  cp /tmp/llama-tg.json /tmp/llama-pp.json "$out/"
  tail -3 /tmp/llama-build.log > "$out/llama-build-tail.log"
  exit 0
fi

if [ "$phase" = bench ]; then
  while [ ! -f /tmp/llama.done ]; do sleep 5; done
  cp /tmp/llama-tg.json "$out/"
  cp /tmp/llama-pp.json "$out/"
  if [ "${RATE:-0}" = 1 ]; then  # the CPU expert kernels alone, by format, instruction set and threads
    python3 bench/cpu_expert_rate.py "$out/cpu-expert-rate.json" --threads 8,12,15,16 2>&1 | tee "$out/cpu-expert-rate.log"
  fi
  python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-20b.json" --folder /tmp/g20 --fractions "$fractions" \
    --routing "$routing" --misses device --cpu-threads "$cpu_threads" --new 128 --repeats 2 \
    --llama-json /tmp/llama-tg.json \
    2>&1 | tee "$out/decode-gpt-oss-20b.log" | grep -v '^{'
  exit 0
fi

if [ "$phase" = tier ]; then  # the CPU expert tier alone (no llama.cpp build): its tests, its rates, its decode
  build_cpu_kernels
  lscpu > "$out/cpu.txt"
  write_checkpoint &
  TRITON_INTERPRET=1 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpt_oss_experts_cpu.py \
    tests/kernels/test_glu_experts_cpu.py tests/kernels/test_cpu_share.py -k "not decoding and not verify" \
    2>&1 | tail -3 | tee "$out/cpu-tests.log"
  python3 -m pytest -q -p no:cacheprovider tests/engine/test_cpu_tier_cuda.py tests/engine/test_device_misses_cuda.py \
    2>&1 | tail -15 | tee "$out/cuda-tests.log"
  wait
  python3 bench/cpu_expert_rate.py "$out/cpu-expert-rate.json" 2>&1 | tee "$out/cpu-expert-rate.log"
  python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-20b.json" --folder /tmp/g20 --fractions "$fractions" \
    --routing "$routing" --misses device --cpu-threads "$cpu_threads" --new 128 --repeats 2 \
    --llama-json "${LLAMA_JSON:?the llama-bench -o json file of this session}" \
    2>&1 | tee "$out/decode-gpt-oss-20b.log" | grep -v '^{'
  exit 0
fi

if [ "$phase" = glm ]; then
  python3 bench/decode_glm.py "$out/decode-glm-4.5-air-fp8.json" --folder /tmp/glm --fractions "$fractions" \
    --routing uniform --misses device --cpu-threads "$cpu_threads" --new 64 --repeats 2 2>&1 \
    | tee "$out/decode-glm.log" | grep -v '^{'
  exit 0
fi
echo "unknown phase $phase" >&2
exit 2
