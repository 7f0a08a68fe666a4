"""Where the MXFP4 one-token expert programs spend their instructions, without a GPU: gpt-oss-20b's gate_up and down
in float16 pairs (gpt_oss_experts_half_pairs.py) at the default rows a program, compiled for sm_90 as an H200 launches
them for a resident decode (dependent launches on, the picks' rows the arenas' slots), their SASS counted by class.

    python3 bench/mxfp4_one_token_sass.py OUT.json

The classes: `decode and multiply`, the e2m1 codes put into float16 pairs and their packed FMAs (LOP3, shifts, the
IMAD.SHL that ptxas makes of some shifts, HFMA2); `loads`; `reduction across lanes` (SHFL and the adds beside it are
counted with `other`); `other` (the table lookups, addresses, the groups' scales, the epilogue). Instructions per
weight = the program's instructions / the weights one lane multiplies (rows x 32 codes x 4-word groups a step x
steps, masked lanes of the last step included). With Nsight Compute's issue rate (bench/NOTES.md) this says how far
the programs are from being issue-bound. Uses the Triton installed (its bundled ptxas and cuobjdump).
"""

import json
import platform
import sys
from collections import Counter
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.gpt_oss_experts_half_pairs import _half_pairs_down_kernel, _half_pairs_gate_up_kernel
from app.kernels.gpt_oss_experts_triton import pick_config
from app.kernels.mxfp4_half_pairs import LARGEST_INPUT_EXPONENT, activation_shift
from bench.sm90_sass import compile_sm90, sass_opcodes

HIDDEN = WIDTH = 2880  # gpt-oss-20b
PICKS, COLUMNS, LIMIT = 4, 6, 7.0
DEFAULT = pick_config(PICKS, mxfp4=True)  # one token's picks: the float16-pair programs
TABLE = {"weight_ptr": "*i32", "scale_ptr": "*u8", "bias_ptr": "*bf16", "rows_ptr": "*i64"}
COLUMN_INDICES = dict.fromkeys(("weight_column", "scale_column", "bias_column"), "i32")
KERNELS = {
    "gate_up": (_half_pairs_gate_up_kernel, {"pairs_ptr": "*fp16", "unscale_ptr": "*fp32", **TABLE,
                                             "activations_ptr": "*fp16", "limit": "fp32", "alpha": "fp32",
                                             **COLUMN_INDICES},
                dict(table_ptr=None, H=HIDDEN, W=WIDTH, PICKS=PICKS, COLUMNS=COLUMNS,
                     ACT_SCALE=2.0 ** activation_shift(LIMIT), BLOCK_N=DEFAULT.gate_up.features, PDL=True),
                DEFAULT.gate_up.warps, HIDDEN),
    "down": (_half_pairs_down_kernel, {"activations_ptr": "*fp16", **TABLE, "routing_ptr": "*bf16",
                                       "per_pick_ptr": "*fp32", **COLUMN_INDICES},
             dict(table_ptr=None, H=HIDDEN, W=WIDTH, COLUMNS=COLUMNS, BLOCK_N=DEFAULT.down.features, PDL=True,
                  ACT_UNSCALE=2.0 ** (LARGEST_INPUT_EXPONENT - activation_shift(LIMIT))), DEFAULT.down.warps, WIDTH),
}
DECODE_AND_MULTIPLY = ("LOP3", "SHF", "IMAD.SHL", "HFMA2")


def classes(opcodes: Counter) -> dict[str, int]:
    counted = {"decode and multiply": 0, "loads": 0, "reduction across lanes": 0, "other": 0}
    for opcode, count in opcodes.items():
        if opcode.startswith("SHFL"):  # before SHF
            counted["reduction across lanes"] += count
        elif opcode.startswith(DECODE_AND_MULTIPLY):
            counted["decode and multiply"] += count
        elif opcode.startswith("LDG"):
            counted["loads"] += count
        else:
            counted["other"] += count
    return counted


def main(out_path: str) -> None:
    cases = []
    for name, (kernel, arguments, constants, warps, k_size) in KERNELS.items():
        compiled = compile_sm90(kernel, arguments, constants, num_warps=warps, launch_pdl=True)
        opcodes = sass_opcodes(compiled.asm["cubin"], modifiers=True)
        steps = triton.cdiv(k_size // 32, 32)
        weights_a_lane = constants["BLOCK_N"] * steps * 32
        total = sum(opcodes.values())
        case = {"kernel": name, "rows_a_program": constants["BLOCK_N"], "warps": warps, "inputs": k_size,
                "instructions": total, "weights_a_lane": weights_a_lane,
                "instructions_per_weight": total / weights_a_lane, "classes": classes(opcodes),
                "opcodes": dict(opcodes.most_common())}
        case["decode_and_multiply_per_weight"] = case["classes"]["decode and multiply"] / weights_a_lane
        cases.append(case)
        print(f"{name}: {total} instructions a program, {case['instructions_per_weight']:.2f} a weight "
              f"({case['decode_and_multiply_per_weight']:.2f} decoding and multiplying); {case['classes']}")
    report = {
        "machine": {"host": platform.node(), "triton": triton.__version__, "target": "sm_90 (compiled, not run)"},
        "command": "python3 " + " ".join(sys.argv),
        "shapes": {"hidden": HIDDEN, "width": WIDTH, "picks": PICKS},
        "cases": cases,
    }
    Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
