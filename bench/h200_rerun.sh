#!/usr/bin/env bash
# A later device call of the same session as bench/h200_session.sh, on a fresh machine: the checkpoint written
# again, the CUDA tests of the device-served misses, and this engine's decode, compared with the llama.cpp
# figures the session measured (bench/results/llama-cpp-gpt-oss-20b-2026-12-01.json; llama.cpp is not rebuilt).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
llama=bench/results/llama-cpp-gpt-oss-20b-2026-12-01.json
python3 -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from bench.decode_gpt_oss import write_synthetic
write_synthetic(Path('/tmp/g20'), '20b')" > "$out/checkpoint.log" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/engine/test_device_misses_cuda.py tests/engine/spec/test_spec_cuda.py \
  tests/engine/test_glm_cuda.py tests/engine/test_cuda.py 2>&1 | tee "$out/cuda-tests.log" | tail -6
python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-20b.json" --folder /tmp/g20 --fractions 1.0,0.5,0.25,0.1 \
  --routing model,trace,uniform --misses device --new 128 --repeats 2 --llama-json $llama \
  2>&1 | tee "$out/decode-gpt-oss-20b.log" | grep -v '^{'
python3 bench/decode_gpt_oss.py "$out/decode-gpt-oss-20b-other-paths.json" --folder /tmp/g20 --fractions 0.5 \
  --routing trace,uniform --misses host --new 128 --repeats 2 --llama-json $llama \
  2>&1 | tee "$out/decode-gpt-oss-20b-other-paths.log" | grep -v '^{'
