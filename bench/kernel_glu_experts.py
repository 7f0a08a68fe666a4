"""The fused GLM expert kernels (glu_experts_triton.py) on a CUDA GPU, at GLM-4.5-Air's real shapes.

    python3 bench/kernel_glu_experts.py OUT.json [--prefill]

All 128 experts of a layer sit in cache slots (hidden 4096, moe_intermediate 1408), each token routes to
8 of them; T = 1 (decode), 16 (a verify block) and 128 (a prefill chunk). Weight formats: FP8 with one
scale per output channel (compressed-tensors: GLM-4.5-Air-FP8's own layout), FP8 with 128 × 128 block
scales (fp8: the GLM-5 FP8 layout) and bf16. Each case is first checked against the float32 torch
reference (poisoned allocations, skipped picks), then timed as in kernel_gpt_oss_experts.py: `op`
(do_bench, L2 flushed), `graph` (CUDA graph cycling through 8 routings) and `kernels` (profiler).
Bandwidth = bytes of the experts the tokens route to (weights and scales, each read once) / time,
against a device-to-device copy (bytes read + written) measured in the same run. T = 1 also sweeps tile
sizes and the product dtype (FP8 weights in float16 or bf16) in the Air format; its fastest tiles per
projection run once more as the `tuned` case, in every format. With --prefill instead: prefill chunks (128 and
PREFILL_CHUNK tokens) of both FP8 formats, the default's FP8 products against the same tiles converting the weights.
"""

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.fp8_products_triton import runs_fp8_products
from app.kernels.glu_experts import glu_experts_torch
from app.kernels.glu_experts_triton import LaunchConfig, Tiles, pick_config, run_experts
from app.plan import PREFILL_CHUNK
from bench import kernel_gpt_oss_experts as gpt_oss_bench
from bench.kernel_gpt_oss_experts import (
    attempt,
    bytes_read,
    expert_bytes,
    kernel_times,
    print_case,
    start_report,
)
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_glu_experts_cuda import FP8_INPUTS_ERROR
from tests.kernels.test_gpt_oss_experts import relative_error

HIDDEN, WIDTH, NUM_SLOTS, PICKS = 4096, 1408, 128, 8  # zai-org/GLM-4.5-Air-FP8 config.json
TOKEN_COUNTS = (1, 16, 128)
PREFILL_TOKENS = (128, PREFILL_CHUNK)
FORMATS = {"fp8-per-channel": None, "fp8-block128": (128, 128), "bf16": None}
# gate_up tiles hold features / 2 gate rows and as many up rows
SWEEP = [LaunchConfig(16, Tiles(64, 128), Tiles(64, 128), fp16_products=False)] + [
    LaunchConfig(16, tiles, tiles, fp16_products=True)
    for tiles in (Tiles(64, 128), Tiles(128, 128), Tiles(64, 256), Tiles(64, 128, 4, 4), Tiles(128, 128, 8, 3))
]


def make_arenas(fmt: str) -> dict[str, torch.Tensor]:
    """Weights about the size of trained ones; FP8 scales chosen so that dequantized weights are too."""
    arenas = {}
    for name, (out, inputs) in {"gate_proj": (WIDTH, HIDDEN), "up_proj": (WIDTH, HIDDEN),
                                "down_proj": (HIDDEN, WIDTH)}.items():
        if fmt == "bf16":
            arenas[f"{name}.weight"] = (torch.randn(NUM_SLOTS, out, inputs, device="cuda") * inputs**-0.5).bfloat16()
            continue
        weight = torch.empty(NUM_SLOTS, out, inputs, dtype=torch.float8_e4m3fn, device="cuda")
        for slot in range(NUM_SLOTS):  # one slot at a time: a float32 copy of the whole arena is 3 GB
            weight[slot] = (torch.randn(out, inputs, device="cuda") * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        arenas[f"{name}.weight"] = weight
        scale = 0.01 * inputs**-0.5
        if FORMATS[fmt]:
            blocks = (NUM_SLOTS, -(-out // 128), -(-inputs // 128))
            arenas[f"{name}.weight_scale_inv"] = scale * (0.5 + torch.rand(blocks, device="cuda"))
        else:
            arenas[f"{name}.weight_scale"] = scale * (0.5 + torch.rand(NUM_SLOTS, out, 1, device="cuda"))
    return arenas


def make_routing(tokens: int, skip: float = 0.0):
    return gpt_oss_bench.make_routing(tokens, skip, NUM_SLOTS, PICKS)


def check(arenas, fmt: str, tokens: int, config: LaunchConfig | None) -> dict:
    hidden = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    slots, weights = make_routing(tokens, skip=0.1)
    with poisoned_allocations():
        out = run_experts(hidden, arenas, slots, weights, FORMATS[fmt], config)
    ref = glu_experts_torch(hidden.float(), arenas, slots, weights.float(), FORMATS[fmt])
    error = relative_error(out, ref)
    config = config or pick_config(slots.numel())
    quantized = config.fp8_products and runs_fp8_products(hidden, arenas["gate_proj.weight"])
    bound = FP8_INPUTS_ERROR if quantized else 1e-2  # x and the activations quantized to e4m3 on FP8 products
    return {"relative_error": error, "all_finite": bool(out.isfinite().all()), "passed": error < bound}


def time_case(arenas, fmt: str, tokens: int, config: LaunchConfig | None) -> dict:
    hidden = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    routings = [make_routing(tokens) for _ in range(8)]
    if tokens == 1:  # 8 disjoint sets of 8 experts: consecutive graph replays share nothing in L2
        order = torch.randperm(NUM_SLOTS, device="cuda")[: 8 * PICKS].view(8, 1, PICKS)
        routings = [(order[i], weights) for i, (_, weights) in enumerate(routings)]
    slots, weights = routings[0]
    op = lambda: run_experts(hidden, arenas, slots, weights, FORMATS[fmt], config)  # noqa: E731
    calls = iter(range(10**9))

    def rotating():
        s, w = routings[next(calls) % len(routings)]
        return run_experts(hidden, arenas, s, w, FORMATS[fmt], config)

    op()
    moved = bytes_read(arenas, slots)
    moved_rotating = statistics.mean(bytes_read(arenas, s) for s, _ in routings)
    op_ms = do_bench(op, warmup=10, rep=50, return_mode="median")
    graph_ms = do_bench_cudagraph(rotating, rep=20, return_mode="median")
    kernels = kernel_times(op, runs=10)
    projections_us = kernels.get("_gate_up_kernel", 0) + kernels.get("_down_kernel", 0)
    return {
        "bytes_read": moved,
        "op_us": op_ms * 1e3,
        "graph_us": graph_ms * 1e3,
        "kernels_us": kernels,
        "op_bandwidth": moved / (op_ms * 1e-3),
        "graph_bandwidth": moved_rotating / (graph_ms * 1e-3),
        "projection_kernels_bandwidth": moved / (projections_us * 1e-6) if projections_us else None,
    }


def profile_config(arenas, fmt: str, config: LaunchConfig) -> dict:
    hidden = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    slots, weights = make_routing(1)
    op = lambda: run_experts(hidden, arenas, slots, weights, FORMATS[fmt], config)  # noqa: E731
    return {"kernels_us": kernel_times(op, runs=10)}


def sweep_configs(arenas, fmt: str) -> list[dict]:
    """T = 1: each candidate for both projections; the profiler separates the two kernels."""
    rows = []
    for config in SWEEP:
        rows.append({"config": repr(config)} | attempt(profile_config, arenas, fmt, config))
        print(f"  sweep {config}: {rows[-1].get('kernels_us', rows[-1].get('error'))}", flush=True)
    return rows


def fastest_config(sweep: list[dict]) -> LaunchConfig:
    """The sweep's fastest tiles for each projection, separately (with the fastest gate_up's product dtype)."""
    timed = [(config, row) for config, row in zip(SWEEP, sweep, strict=True) if "kernels_us" in row]
    gate_up = min(timed, key=lambda pair: pair[1]["kernels_us"]["_gate_up_kernel"])[0]
    down = min(timed, key=lambda pair: pair[1]["kernels_us"]["_down_kernel"])[0]
    return LaunchConfig(16, gate_up.gate_up, down.down, gate_up.fp16_products)


def prefill(report: dict, save) -> None:
    """Prefill chunks of FP8 experts: the default's FP8 products (x and the activations quantized to e4m3) against
    the same tiles converting the weights to float16 in registers."""
    for fmt in ("fp8-per-channel", "fp8-block128"):
        arenas = make_arenas(fmt)
        for tokens in PREFILL_TOKENS:
            default = pick_config(tokens * PICKS)
            for config in (default, replace(default, fp8_products=False)):
                case = {"format": fmt, "tokens": tokens, "config": repr(config), "fp8_products": config.fp8_products}
                case["check"] = attempt(check, arenas, fmt, tokens, config)
                case |= attempt(time_case, arenas, fmt, tokens, config)
                report["cases"].append(case)
                print(f"{fmt:15} T={tokens:3} fp8 products {config.fp8_products!s:5} {case.get('check')} "
                      f"op={case.get('op_us', 0):.1f}us graph={case.get('graph_us', 0):.1f}us "
                      f"kernels={case.get('kernels_us', case.get('error'))}", flush=True)
                save()
        del arenas
        torch.cuda.empty_cache()


def main(out_path: str, prefill_only: bool) -> None:
    report, save = start_report(out_path, {"hidden": HIDDEN, "width": WIDTH, "slots": NUM_SLOTS, "picks": PICKS})
    copy = report["copy_bandwidth"]
    if prefill_only:
        prefill(report, save)
        save()
        return
    tuned = None
    for fmt in FORMATS:
        arenas = make_arenas(fmt)
        report["expert_bytes_" + fmt] = expert_bytes(arenas)
        if fmt == "fp8-per-channel":
            sweep = report["sweeps"][fmt + "_T1"] = sweep_configs(arenas, fmt)
            tuned = fastest_config(sweep) if any("kernels_us" in row for row in sweep) else None
            save()
        tuned_cases = [(1, tuned), (16, tuned)] if tuned else []
        for tokens, config in [(tokens, None) for tokens in TOKEN_COUNTS] + tuned_cases:
            config_used = config or pick_config(tokens * PICKS)
            case = {"format": fmt, "tokens": tokens, "config": repr(config_used), "tuned": config is not None}
            case["check"] = attempt(check, arenas, fmt, tokens, config)
            case |= attempt(time_case, arenas, fmt, tokens, config)
            if "op_bandwidth" in case:
                case["floor_us"] = case["bytes_read"] / copy * 1e6
                case["fraction_of_copy_bandwidth"] = {
                    key: case[key] / copy
                    for key in ("op_bandwidth", "graph_bandwidth", "projection_kernels_bandwidth")
                    if case[key]
                }
            report["cases"].append(case)
            print_case(case, format_width=15)
            save()
        del arenas
        torch.cuda.empty_cache()
    save()
    print(f"wrote {out_path} after {report['seconds']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], "--prefill" in sys.argv[2:])
