"""What Triton's FMA fusion is worth to a kernel, without a GPU: fp8_linear's one-token o_proj (GLM-4.5-Air, 4096 x
12288, per-channel scales, the default tiles) compiled for sm_90 with fusion on and off, its SASS counted.

    python3 bench/fma_fusion_sass.py OUT.json

Uses the Triton installed (its bundled ptxas and cuobjdump); app/kernels/__init__.py keeps fusion on because of it.
"""

import json
import platform
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.fp8_linear_triton import _one_token_kernel, one_token_tiles
from bench.sm90_sass import compile_sm90, sass_opcodes

POINTERS = {"x_ptr": "*bf16", "weight_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "residual_ptr": "*bf16",
            "out_ptr": "*bf16"}
N, K = 4096, 12288


def compile_one_token(fusion: bool):
    tiles = one_token_tiles(K, glu=False)
    constants = dict(N=N, K=K, SCALES=1, SCALE_ROWS=1, SCALE_COLS=1, GLU=False, HAS_RESIDUAL=True,
                     BLOCK_N=tiles.rows, BLOCK_K=tiles.depth, FOLD=tiles.fold, WARPS=tiles.warps, PDL=True)
    return compile_sm90(_one_token_kernel, POINTERS, constants, num_warps=tiles.warps, enable_fp_fusion=fusion,
                        launch_pdl=True)


def main(out_path: str) -> None:
    cases = []
    for fusion in (True, False):
        opcodes = sass_opcodes(compile_one_token(fusion).asm["cubin"])
        cases.append({"fp_fusion": fusion, "instructions": sum(opcodes.values()),
                      **{op: opcodes[op] for op in ("FFMA", "FMUL", "FADD")}})
        print(cases[-1])
    report = {
        "machine": {"host": platform.node(), "triton": triton.__version__, "target": "sm_90 (compiled, not run)"},
        "command": "python3 " + " ".join(sys.argv),
        "kernel": f"fp8_linear one token, {N} x {K}, per-channel scales, residual, tiles {one_token_tiles(K, False)}",
        "cases": cases,
        "extra_instructions_without_fusion": cases[1]["instructions"] / cases[0]["instructions"] - 1,
    }
    Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
