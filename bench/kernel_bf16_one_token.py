"""gpt-oss's attention products at one token on a CUDA GPU: bf16 weights with a bias, cuBLAS's addmm (what the engine
ran) against the single-token kernel (rows_times_vector_triton.py through `linear`, the bias added in its launch).

    python3 bench/kernel_bf16_one_token.py OUT.json

q/k/v 5120 x 2880 and o 2880 x 4096 (gpt-oss-20b and -120b alike), each timed in a CUDA graph that cycles through
copies of the weight exceeding the L2, as a decode step reads each weight once; the kernel at its default tiles
(`one_token_tiles`, which gives narrow outputs fewer rows a program) and at other rows a program. Floor = bytes /
device-to-device copy bandwidth (read + write) measured in the same run.
"""

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.fp8_linear_triton import one_token_tiles, run_one_token
from bench.kernel_fp8_linear import L2_EXCEEDED
from bench.kernel_gpt_oss_experts import attempt, start_report
from tests.kernels.test_gpt_oss_experts import relative_error

PRODUCTS = {"qkv": (5120, 2880), "o": (2880, 4096)}  # (out, in)
ROWS = (1, 2, 4, 8)


def product_case(name: str, rows: int | None) -> dict:
    """One product's check and graph time: addmm for rows None, else the kernel at `rows` rows a program (0: the
    default tiles)."""
    out_features, inputs = PRODUCTS[name]
    weight = (torch.randn(out_features, inputs, device="cuda") * inputs**-0.5).bfloat16()
    bias = (torch.randn(out_features, device="cuda") * 0.1).bfloat16()
    x = torch.randn(1, inputs, device="cuda").bfloat16()
    tiles = one_token_tiles(inputs, False, weight.element_size(), out_features)
    tiles = replace(tiles, rows=rows) if rows else tiles

    def product(w, b):
        if rows is None:
            return torch.addmm(b, x, w.T)
        return run_one_token(x, w, None, None, False, b[None], tiles)

    out = product(weight, bias)
    ref = x.float() @ weight.float().T + bias.float()
    copies = [(weight, bias)] + [(weight.clone(), bias.clone()) for _ in range(L2_EXCEEDED // weight.nbytes)]
    calls = itertools.count()
    graph_ms = do_bench_cudagraph(lambda: product(*copies[next(calls) % len(copies)]), rep=20, return_mode="median")
    moved = weight.nbytes + 2 * bias.nbytes + x.nbytes + out.nbytes
    return {"relative_error": relative_error(out, ref), "graph_us": graph_ms * 1e3, "bytes_read": moved,
            "tiles": "addmm" if rows is None else repr(tiles)}


def main(out_path: str) -> None:
    report, save = start_report(out_path, {"products": PRODUCTS})
    report["floor"] = "bytes (weight, bias twice as the residual row, x, output) / copy bandwidth (read + write)"
    for name in PRODUCTS:
        for rows in (None, 0, *ROWS):
            case = {"product": name, "rows": rows} | attempt(product_case, name, rows)
            if "graph_us" in case:
                case["fraction_of_floor"] = case["bytes_read"] / report["copy_bandwidth"] / (case["graph_us"] * 1e-6)
            report["cases"].append(case)
            print(f"{name:4} {case.get('tiles', ''):64} {case.get('graph_us', 0):6.1f} us "
                  f"{case.get('fraction_of_floor', 0):.2f} err {case.get('relative_error', case.get('error'))}",
                  flush=True)
            save()
    print(f"wrote {out_path} after {report['seconds']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
