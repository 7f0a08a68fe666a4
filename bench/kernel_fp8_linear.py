"""The FP8 dense linear kernel (app/kernels/fp8_linear_triton.py) on a CUDA GPU, at GLM-4.5-Air's dense shapes.

    python3 bench/kernel_fp8_linear.py OUT.json [--prefill]

Weights: GLM-4.5-Air's attention (q_proj 12288 × 4096, k/v_proj 1024 × 4096, o_proj 4096 × 12288), its dense
MLP (layer 0, intermediate 10944) and shared expert (1408), as FP8 with one scale per output channel
(GLM-4.5-Air-FP8's layout) and with 128 × 128 block scales (GLM-5's). T = 1 (decode), 16 (a verify block), 128
(a prefill chunk), bf16 activations. Each case is checked against the float32 torch reference, then timed:
`op` (do_bench, L2 flushed), `graph` (a CUDA graph cycling through copies of the weight that together exceed
the L2, as a decode step reads each layer's weights once), and `bf16_cublas` (x @ W.T with the weight
dequantized to bf16 at load, the engine's path before this kernel: twice the bytes). Bytes = weight + scale +
x + output, each once; floor = bytes / device-to-device copy bandwidth (read + write) measured in the same run.
`split_sweep`: T = 1, k_proj and o_proj, per-channel, over weight tiles and split-K. With --prefill instead: a
prefill chunk (PREFILL_CHUNK tokens, and 128) of the large products, both formats: the converting kernel at its
default tiles, then the FP8 products (fp8_products_triton.py, x quantized to e4m3 as the checkpoint declares: the
quantizing launch is timed with each product, and alone) at their default and over tiles (PREFILL_SWEEP: tokens a
tile, weight rows, inputs a step, warps, stages), against bf16 cuBLAS and torch's own FP8 product (`torch._scaled_mm`
of the same quantized x, without its quantizing launch; per channel, and with block scales where torch takes them).
"""

import math
import sys
from functools import partial
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.expert_tiles import Tiles
from app.kernels.formats.fp8 import dequantize_blocks, dequantize_per_channel
from app.kernels.fp8_linear import fp8_linear_torch
from app.kernels.fp8_linear_triton import pick_tiles, prefill_tiles, run_fp8_linear
from app.kernels.fp8_products_triton import quantize_activations, runs_fp8_products
from app.plan import PREFILL_CHUNK
from bench.kernel_gpt_oss_experts import attempt, start_report
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_fp8_prefill import dequantized_activations
from tests.kernels.test_gpt_oss_experts import relative_error

SHAPES = {  # zai-org/GLM-4.5-Air-FP8: (out, in)
    "q_proj": (12288, 4096), "k_proj": (1024, 4096), "o_proj": (4096, 12288),
    "dense_gate": (10944, 4096), "dense_down": (4096, 10944), "shared_gate": (1408, 4096), "shared_down": (4096, 1408),
}
FORMATS = {"per-channel": None, "block128": (128, 128)}
TOKEN_COUNTS = (1, 16, 128)
L2_EXCEEDED = 256 << 20  # bytes of weight copies a graph cycles through
PREFILL_SHAPES = ("q_proj", "o_proj", "dense_gate")
PREFILL_SWEEP = [(block_m, Tiles(*tiles), split) for block_m, tiles, split in (  # FP8 products
    (128, (128, 128, 8, 4), 1), (64, (128, 128, 8, 4), 1), (128, (128, 128, 8, 3), 1), (64, (128, 128, 8, 3), 1),
    (128, (128, 128, 8, 4), 2), (64, (128, 128, 8, 4), 2), (64, (128, 128, 8, 4), 4), (64, (64, 128, 4, 4), 1),
    (64, (64, 128, 4, 4), 2), (128, (128, 64, 8, 4), 1), (128, (128, 256, 8, 3), 1))]
SWEEP = [(tiles, split) for tiles in (Tiles(32, 128, 4, 4), Tiles(64, 128, 4, 4), Tiles(16, 256, 4, 3))
         for split in (1, 2, 4, 8)]


def make_weight(out: int, inputs: int, block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 weight and scales chosen so that the dequantized weight has trained weights' size."""
    weight = (torch.randn(out, inputs, device="cuda") * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    shape = (math.ceil(out / block[0]), math.ceil(inputs / block[1])) if block else (out, 1)
    return weight, 0.01 * inputs**-0.5 * (0.5 + torch.rand(shape, device="cuda"))


def dequantized(weight: torch.Tensor, scale: torch.Tensor, block) -> torch.Tensor:
    if block is None:
        return dequantize_per_channel(weight, scale, torch.bfloat16)
    return dequantize_blocks(weight, scale, block, torch.bfloat16)


def check(weight, scale, block, tokens: int, product=None, fp8_products: bool | None = None) -> dict:
    """`product` (x -> x @ W.T; run_fp8_linear at its own tiles where None) against the float32 reference, of x as
    quantized where the product runs on FP8 products (`fp8_products`; None: where run_fp8_linear takes them)."""
    x = torch.randn(tokens, weight.shape[1], device="cuda").bfloat16()
    with poisoned_allocations():
        out = product(x) if product else run_fp8_linear(x, weight, scale, block)
    quantized = runs_fp8_products(x, weight) if fp8_products is None else fp8_products
    ref = fp8_linear_torch(dequantized_activations(x) if quantized else x.float(), weight, scale,
                           block)
    error = relative_error(out, ref)
    return {"relative_error": error, "all_finite": bool(out.isfinite().all()), "passed": error < 1e-2}


def time_case(weight, scale, block, tokens: int, tiles=None) -> dict:
    out_features, inputs = weight.shape
    x = torch.randn(tokens, inputs, device="cuda").bfloat16()
    copies = [(weight, scale)] + [(weight.clone(), scale.clone()) for _ in range(L2_EXCEEDED // weight.nbytes)]
    calls = iter(range(10**9))

    def rotating():
        w, s = copies[next(calls) % len(copies)]
        return run_fp8_linear(x, w, s, block, tiles)

    op_ms = do_bench(lambda: run_fp8_linear(x, weight, scale, block, tiles), warmup=10, rep=50, return_mode="median")
    graph_ms = do_bench_cudagraph(rotating, rep=20, return_mode="median")
    moved = weight.nbytes + scale.nbytes + x.nbytes + tokens * out_features * 2
    return {"bytes_read": moved, "op_us": op_ms * 1e3, "graph_us": graph_ms * 1e3,
            "op_bandwidth": moved / (op_ms * 1e-3), "graph_bandwidth": moved / (graph_ms * 1e-3)}


def time_cublas(weight, scale, block, tokens: int) -> dict:
    bf16 = dequantized(weight, scale, block)
    x = torch.randn(tokens, weight.shape[1], device="cuda").bfloat16()
    ms = do_bench(lambda: x @ bf16.T, warmup=10, rep=50, return_mode="median")
    graph_ms = do_bench_cudagraph(lambda: x @ bf16.T, rep=20, return_mode="median")
    return {"bf16_cublas_us": ms * 1e3, "bf16_cublas_graph_us": graph_ms * 1e3,
            "bf16_bytes_read": bf16.nbytes + x.nbytes + tokens * weight.shape[0] * 2}


def time_scaled_mm(weight, scale, block, tokens: int) -> dict:
    """torch's FP8 x FP8 product (cuBLASLt / CUTLASS) of x quantized as run_fp8_linear quantizes it, in a graph."""
    x = torch.randn(tokens, weight.shape[1], device="cuda").bfloat16()
    q, x_scale = quantize_activations(x)
    scales = (x_scale[:, None], scale.T) if block is None else (x_scale, scale)
    product = partial(torch._scaled_mm, q, weight.T, *scales, out_dtype=torch.bfloat16)
    error = relative_error(product(), fp8_linear_torch(dequantized_activations(x), weight, scale, block))
    graph_ms = do_bench_cudagraph(product, rep=20, return_mode="median")
    return {"torch_scaled_mm_graph_us": graph_ms * 1e3, "torch_scaled_mm_relative_error": error}


def prefill_sweep(report: dict, save) -> None:
    sweep = report["sweeps"]["prefill"] = []
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for fmt, block in FORMATS.items():
        for name in PREFILL_SHAPES:
            weight, scale = make_weight(*SHAPES[name], block)
            for tokens in (PREFILL_CHUNK, 128):
                cublas = attempt(time_cublas, weight, scale, block, tokens)
                cublas |= {key if key.startswith("torch") else f"torch_scaled_mm_{key}": value
                           for key, value in attempt(time_scaled_mm, weight, scale, block, tokens).items()}
                converting = ("converting", pick_tiles(tokens, *SHAPES[name], sm_count))
                default = f"default {prefill_tiles(tokens, SHAPES[name][0], sm_count)}"
                fp8 = [("fp8 products", tiles) for tiles in [None, *PREFILL_SWEEP]]
                for kernel, tiles in [converting, *fp8]:
                    row = {"format": fmt, "weight": name, "tokens": tokens, "kernel": kernel,
                           "tiles": repr(tiles) if tiles else default, **cublas}
                    fp8_products = kernel != "converting"
                    product = partial(run_fp8_linear, weight=weight, scale=scale, block=block, tiles=tiles,
                                      fp8_products=fp8_products)
                    row |= attempt(prefill_case, weight, scale, block, tokens, product, fp8_products)
                    sweep.append(row)
                    error = row.get("relative_error", row.get("error"))
                    print(f"  prefill {fmt:11} {name:10} T={tokens} {kernel:12} {row['tiles']:66} "
                          f"op {row.get('op_us', 0):6.1f} graph {row.get('graph_us', 0):6.1f} us cuBLAS "
                          f"{row.get('bf16_cublas_us', 0):6.1f} graph {row.get('bf16_cublas_graph_us', 0):6.1f} us "
                          f"scaled_mm graph {row.get('torch_scaled_mm_graph_us', 0):6.1f} us "
                          f"err {error}", flush=True)
                    save()
    x = torch.randn(PREFILL_CHUNK, SHAPES["q_proj"][1], device="cuda").bfloat16()
    report["quantize_activations_graph_us"] = do_bench_cudagraph(lambda: quantize_activations(x), rep=20,
                                                                 return_mode="median") * 1e3


def prefill_case(weight, scale, block, tokens: int, product, fp8_products: bool) -> dict:
    """The product's error against the float32 reference and its time: eager (do_bench; a prefill reads each weight
    once per chunk, cached or not), and in a CUDA graph, without the host's launches between the kernels."""
    x = torch.randn(tokens, weight.shape[1], device="cuda").bfloat16()
    ms = do_bench(lambda: product(x), warmup=10, rep=50, return_mode="median")
    graph_ms = do_bench_cudagraph(lambda: product(x), rep=20, return_mode="median")
    return {**check(weight, scale, block, tokens, product, fp8_products), "op_us": ms * 1e3, "graph_us": graph_ms * 1e3}


def main(out_path: str, prefill: bool) -> None:
    report, save = start_report(out_path, {"dense": SHAPES, "activations": "bf16"})
    report["shapes"].pop("routing")
    report["floor"] = "bytes (weight, scales, x, output) / copy bandwidth (read + write counted)"
    copy = report["copy_bandwidth"]
    if prefill:
        prefill_sweep(report, save)
        save()
        return
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for fmt, block in FORMATS.items():
        for name, (out_features, inputs) in SHAPES.items():
            weight, scale = make_weight(out_features, inputs, block)
            for tokens in TOKEN_COUNTS:
                tiles = pick_tiles(tokens, out_features, inputs, sm_count)
                case = {"format": fmt, "weight": name, "shape": [out_features, inputs], "tokens": tokens,
                        "tiles": repr(tiles), "check": attempt(check, weight, scale, block, tokens)}
                case |= attempt(time_case, weight, scale, block, tokens)
                case |= attempt(time_cublas, weight, scale, block, tokens)
                if "op_us" in case:
                    case["floor_us"] = case["bytes_read"] / copy * 1e6
                    case["fraction_of_copy_bandwidth"] = {"op": case["op_bandwidth"] / copy,
                                                          "graph": case["graph_bandwidth"] / copy}
                report["cases"].append(case)
                print(f"{fmt:11} {name:11} T={tokens:3} {case.get('check')} op={case.get('op_us', 0):.1f}us "
                      f"graph={case.get('graph_us', 0):.1f}us floor={case.get('floor_us', 0):.1f}us "
                      f"bf16 cuBLAS={case.get('bf16_cublas_us', 0):.1f}us {case.get('error', '')}", flush=True)
                save()
    sweep = report["sweeps"]["per-channel_T1"] = []
    for name in ("k_proj", "o_proj"):
        weight, scale = make_weight(*SHAPES[name], None)
        for tiles, split in SWEEP:
            row = {"weight": name, "tiles": repr(tiles), "split": split}
            row |= attempt(time_case, weight, scale, None, 1, (16, tiles, split))
            sweep.append(row)
            print(f"  sweep {name} {tiles} split {split}: graph {row.get('graph_us', row.get('error'))}", flush=True)
            save()
    save()
    print(f"wrote {out_path} after {report['seconds']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], "--prefill" in sys.argv[2:])
