"""What Triton's FMA fusion is worth to a kernel, without a GPU: fp8_linear's one-token o_proj (GLM-4.5-Air, 4096 x
12288, per-channel scales, the default tiles) compiled for sm_90 with fusion on and off, its SASS counted.

    python3 bench/fma_fusion_sass.py OUT.json

Uses the Triton installed (its bundled ptxas and cuobjdump); app/kernels/__init__.py keeps fusion on because of it.
"""

import json
import platform
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.fp8_linear_triton import _one_token_kernel, one_token_tiles

POINTERS = {"x_ptr": "*bf16", "weight_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "residual_ptr": "*bf16",
            "out_ptr": "*bf16"}
N, K = 4096, 12288


def compile_sm90(fusion: bool):
    tiles = one_token_tiles(K, glu=False)
    constants = dict(N=N, K=K, SCALES=1, SCALE_ROWS=1, SCALE_COLS=1, GLU=False, HAS_RESIDUAL=True,
                     BLOCK_N=tiles.rows, BLOCK_K=tiles.depth, FOLD=tiles.fold, WARPS=tiles.warps, PDL=True)
    names = _one_token_kernel.arg_names
    signature = {**POINTERS, **dict.fromkeys(constants, "constexpr")}
    # as a launch specializes them: pointers 16-byte aligned
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in POINTERS}
    source = ASTSource(_one_token_kernel, signature, {(names.index(k),): v for k, v in constants.items()}, attrs)
    options = dict(num_warps=tiles.warps, enable_fp_fusion=fusion, launch_pdl=True)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def sass_opcodes(cubin: bytes, modifiers: bool = False) -> Counter:
    """The cubin's SASS opcodes counted, with their modifiers (IMAD.SHL.U32) or without (IMAD)."""
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run([tool, "-sass", file.name], capture_output=True, text=True, check=True).stdout
    # an instruction line: /*0a30*/  @!P0 FFMA R1, ... ;
    return Counter(match.group(1) if modifiers else match.group(1).split(".")[0]
                   for match in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", listing))


def main(out_path: str) -> None:
    cases = []
    for fusion in (True, False):
        opcodes = sass_opcodes(compile_sm90(fusion).asm["cubin"])
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
