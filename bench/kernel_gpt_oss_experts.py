"""The fused GPT-OSS expert kernels on a CUDA GPU, at gpt-oss-20b's real shapes.

    python3 bench/kernel_gpt_oss_experts.py OUT.json [--tokens 1,4,16,128] [--formats mxfp4] [--no-tile-sweeps]

32 experts sit in cache slots (H = W = 2880), each token routes to 4 of them; T = 1, 4, 16, 128,
256 tokens; MXFP4 and bf16 weights. MXFP4 at T <= 16 also runs the matrix-unit path (what decode took
before the CUDA-core products, and verify blocks before the float16-pair programs) and a sweep of CUDA-core
configurations. Each case is first checked
against the float32 torch reference (fresh random inputs with skipped picks, poisoned allocations),
then timed:
- `op`: triton.testing.do_bench, median, L2 flushed before every run (launch gaps included);
- `graph`: the op captured in a CUDA graph, cycling through 8 routings (no launch gaps, no L2 reuse);
- `kernels`: each kernel's own time from the torch profiler, median over runs with L2 flushed.
Bandwidth = bytes of the experts the tokens route to (every weight, scale and bias read once) /
time, against a device-to-device copy (bytes read + written) measured in the same run. T = 1 also
runs a sweep over tile sizes; T = 128 and 256 over pairs per tile (both skipped by --no-tile-sweeps).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels.gpt_oss_experts import gpt_oss_experts_torch
from app.kernels.gpt_oss_experts_triton import (
    LaunchConfig,
    Tiles,
    half_pairs_config,
    matrix_unit_config,
    pick_config,
    run_experts,
)
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_gpt_oss_experts_cuda import CUDA_CORE_SWEEP

HIDDEN = WIDTH = 2880
NUM_SLOTS, PICKS = 32, 4
TOKEN_COUNTS = (1, 4, 16, 128, 256)
LIMIT, ALPHA = 7.0, 1.702
# matched in the profiler's names: the float16-pair kernels (_half_pairs_gate_up_kernel, ...) count as the projections
KERNELS = ("_plan_kernel", "_rank_kernel", "_tile_starts_kernel", "_half_pairs_kernel", "_gate_up_kernel",
           "_down_kernel", "_sum_picks_kernel")
# MXFP4 steps divide K = 2880: 32 or 64 inputs
TILE_SWEEP = [
    Tiles(*shape)
    for shape in ((32, 64, 4, 3), (32, 64, 4, 4), (64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 8, 3),
                  (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4))
]
# T = 1 in float16 pairs (gpt_oss_experts_half_pairs.py): rows per program (both projections) and warps; then one-warp
# programs of 2 rows for gate_up and 4 or 8 for down
HALF_PAIR_SWEEP = [
    *(LaunchConfig(1, Tiles(rows, 1024, warps), Tiles(rows, 1024, warps), cuda_cores=True, half_pairs=True)
      for rows, warps in ((2, 1), (4, 1), (4, 2), (8, 1), (8, 2), (8, 4), (16, 2), (16, 4), (16, 8), (32, 4), (32, 8),
                          (64, 8))),
    half_pairs_config(2, 4),
    half_pairs_config(2, 8),
]
# T = 1 as before the float16 pairs: float32 products (mxfp4_cuda_cores.py)
FLOAT32_PRODUCTS = LaunchConfig(1, Tiles(16, 1024), Tiles(32, 1024), cuda_cores=True)
DENSE_TILE_SWEEP = [Tiles(32, 64, 4, 4), Tiles(64, 64, 4, 4), Tiles(64, 128, 4, 3), Tiles(128, 64, 4, 4)]


def make_arenas(mxfp4: bool) -> dict[str, torch.Tensor]:
    slots, h, w = NUM_SLOTS, HIDDEN, WIDTH
    arenas = {
        "gate_up_proj_bias": (torch.randn(slots, 2 * w, device="cuda") * 0.1).bfloat16(),
        "down_proj_bias": (torch.randn(slots, h, device="cuda") * 0.1).bfloat16(),
    }
    if mxfp4:
        # scales 2^-9 .. 2^-4, about the size of real gpt-oss expert weights
        def uint8(low, high, *shape):
            return torch.randint(low, high, shape, dtype=torch.uint8, device="cuda")

        arenas["gate_up_proj_blocks"] = uint8(0, 256, slots, 2 * w, h // 32, 16)
        arenas["gate_up_proj_scales"] = uint8(118, 124, slots, 2 * w, h // 32)
        arenas["down_proj_blocks"] = uint8(0, 256, slots, h, w // 32, 16)
        arenas["down_proj_scales"] = uint8(118, 124, slots, h, w // 32)
    else:
        arenas["gate_up_proj"] = (torch.randn(slots, h, 2 * w, device="cuda") * h**-0.5).bfloat16()
        arenas["down_proj"] = (torch.randn(slots, w, h, device="cuda") * w**-0.5).bfloat16()
    return arenas


def make_routing(tokens: int, skip: float = 0.0, num_slots: int = NUM_SLOTS, picks: int = PICKS):
    """slots [T, k] distinct per token, a fraction `skip` of them -1 (never a token's first pick)."""
    slots = torch.rand(tokens, num_slots, device="cuda").topk(picks, dim=-1).indices
    skipped = torch.rand(slots.shape, device="cuda") < skip
    skipped[:, 0] = False
    slots[skipped] = -1
    weights = torch.softmax(torch.randn(tokens, picks, device="cuda"), dim=-1).bfloat16()
    return slots, weights


def expert_bytes(arenas: dict[str, torch.Tensor]) -> int:
    return sum(t[0].numel() * t.element_size() for t in arenas.values())


def bytes_read(arenas, slots) -> int:
    return len(set(slots[slots >= 0].tolist())) * expert_bytes(arenas)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second."""
    source = torch.randint(0, 127, (2 * 2**30,), dtype=torch.int8, device="cuda")
    target = torch.empty_like(source)
    ms = do_bench(lambda: target.copy_(source), warmup=50, rep=300, return_mode="median")
    return 2 * source.numel() / (ms * 1e-3)


def check(arenas, tokens: int, config: LaunchConfig | None) -> dict:
    hidden = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    slots, weights = make_routing(tokens, skip=0.1)
    with poisoned_allocations():
        out = run_experts(hidden, arenas, slots, weights, LIMIT, ALPHA, config)
    ref = gpt_oss_experts_torch(hidden.float(), arenas, slots, weights.float(), LIMIT, ALPHA)
    error = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    return {"relative_error": error, "all_finite": bool(out.isfinite().all()), "passed": error < 1e-2}


def kernel_times(op, runs: int = 30) -> dict[str, float]:
    """Median device time of each kernel, in microseconds, over runs with the L2 flushed first."""
    op()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # 4 times the L2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(runs):
            flush.zero_()
            op()
        torch.cuda.synchronize()
    times = defaultdict(list)
    for event in profile.events():
        name = next((k for k in KERNELS if k in event.name), None)
        if name and event.device_type == torch.autograd.DeviceType.CUDA:
            times[name].append(event.time_range.elapsed_us())
    if not times:
        raise RuntimeError(f"no kernel events; seen: {sorted({e.name for e in profile.events()})[:20]}")
    return {name: statistics.median(values) for name, values in times.items()}


def time_case(arenas, tokens: int, config: LaunchConfig | None) -> dict:
    hidden = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    routings = [make_routing(tokens) for _ in range(8)]
    if tokens == 1:  # 8 disjoint sets of 4 experts: consecutive graph replays share nothing in L2
        order = torch.randperm(NUM_SLOTS, device="cuda").view(8, 1, PICKS)
        routings = [(order[i], weights) for i, (_, weights) in enumerate(routings)]
    slots, weights = routings[0]
    op = lambda: run_experts(hidden, arenas, slots, weights, LIMIT, ALPHA, config)  # noqa: E731
    calls = iter(range(10**9))

    def rotating():
        s, w = routings[next(calls) % len(routings)]
        return run_experts(hidden, arenas, s, w, LIMIT, ALPHA, config)

    op()
    moved = bytes_read(arenas, slots)
    moved_rotating = statistics.mean(bytes_read(arenas, s) for s, _ in routings)
    op_ms = do_bench(op, warmup=25, rep=200, return_mode="median")
    graph_ms = do_bench_cudagraph(rotating, rep=20, return_mode="median")  # unrolls rep / time calls
    kernels = kernel_times(op)
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


def attempt(function, *args) -> dict:
    try:
        return function(*args)
    except Exception as error:  # a config that fails to compile is a result too
        return {"error": f"{type(error).__name__}: {error}"[:2000]}


def profile_config(arenas, tokens: int, config: LaunchConfig) -> dict:
    hidden = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    slots, weights = make_routing(tokens)
    return {"kernels_us": kernel_times(lambda: run_experts(hidden, arenas, slots, weights, LIMIT, ALPHA, config))}


def sweep_tiles(arenas, mxfp4: bool) -> list[dict]:
    """T = 1: each candidate for both projections; the profiler separates the two kernels."""
    rows = []
    for tiles in TILE_SWEEP if mxfp4 else DENSE_TILE_SWEEP:
        rows.append({"tiles": tiles.__dict__} | attempt(profile_config, arenas, 1, LaunchConfig(16, tiles, tiles)))
        print(f"  sweep {tiles}: {rows[-1].get('kernels_us', rows[-1].get('error'))}", flush=True)
    return rows


def fastest_tiles(sweep: list[dict]) -> LaunchConfig:
    """The sweep's fastest tiles for each projection, separately."""
    timed = [row for row in sweep if "kernels_us" in row]
    gate_up = min(timed, key=lambda row: row["kernels_us"]["_gate_up_kernel"])["tiles"]
    down = min(timed, key=lambda row: row["kernels_us"]["_down_kernel"])["tiles"]
    return LaunchConfig(16, Tiles(**gate_up), Tiles(**down))


def sweep_pairs_per_tile(arenas, mxfp4: bool) -> list[dict]:
    rows = []
    for tokens in (128, 256):
        for block_m in (16, 32, 64):
            base = pick_config(tokens * PICKS, mxfp4)
            config = LaunchConfig(block_m, base.gate_up, base.down)
            row = {"tokens": tokens, "pairs_per_tile": block_m}
            row |= {"check": attempt(check, arenas, tokens, config)} | attempt(profile_config, arenas, tokens, config)
            rows.append(row)
            print(f"  T={tokens} BLOCK_M={block_m}: {row.get('kernels_us', row.get('error'))}", flush=True)
    return rows


def start_report(out_path: str, shapes: dict) -> tuple[dict, Callable[[], None]]:
    """The report of a kernel benchmark (machine, command, copy bandwidth measured now) and `save`, to call
    after every step: a run stopped at its time limit still leaves its results."""
    started = time.time()
    torch.manual_seed(0)
    copy = copy_bandwidth()
    report = {
        "machine": machine(),
        "command": "python3 " + " ".join(sys.argv),
        "shapes": {**shapes, "routing": "uniform random"},
        "copy_bandwidth": copy,
        "floor": "bytes of the routed experts / copy bandwidth (read + write counted)",
        "cases": [],
        "sweeps": {},
    }
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s", flush=True)

    def save():
        report["seconds"] = time.time() - started
        Path(out_path).write_text(json.dumps(report, indent=1))

    return report, save


def sweep_cuda_cores(arenas, token_counts) -> list[dict]:
    """Each CUDA-core configuration at each decode size: kernel times and a check against the reference."""
    rows = []
    for tokens in token_counts:
        for config in CUDA_CORE_SWEEP:
            if config.pairs_per_tile > 1 and tokens == 1:
                continue  # one token's picks are distinct slots
            row = {"tokens": tokens, "config": repr(config), "check": attempt(check, arenas, tokens, config)}
            rows.append(row | attempt(profile_config, arenas, tokens, config))
            print(f"  T={tokens} {config}: {rows[-1].get('kernels_us', rows[-1].get('error'))}", flush=True)
    return rows


def sweep_half_pairs(arenas) -> list[dict]:
    """T = 1 in float16 pairs: each configuration's kernel times and a check against the reference."""
    rows = []
    for config in HALF_PAIR_SWEEP:
        row = {"tokens": 1, "config": repr(config), "check": attempt(check, arenas, 1, config)}
        rows.append(row | attempt(profile_config, arenas, 1, config))
        print(f"  T=1 {config}: {rows[-1].get('kernels_us', rows[-1].get('error'))}", flush=True)
    return rows


def main(out_path: str, token_counts: list[int], formats: list[str], tile_sweeps: bool) -> None:
    report, save = start_report(out_path, {"hidden": HIDDEN, "width": WIDTH, "slots": NUM_SLOTS, "picks": PICKS})
    copy = report["copy_bandwidth"]
    for fmt in formats:
        mxfp4 = fmt == "mxfp4"
        arenas = make_arenas(mxfp4)
        report["expert_bytes_" + fmt] = expert_bytes(arenas)
        configs = [(tokens, None) for tokens in token_counts]
        if mxfp4:  # decode and verify blocks on matrix units, as before the CUDA-core products, and T = 1 before
            # the half pairs
            configs += [(t, matrix_unit_config(t * PICKS, mxfp4)) for t in token_counts if t * PICKS <= 64]
            configs += [(1, FLOAT32_PRODUCTS)] if 1 in token_counts else []
        if tile_sweeps:
            sweep = report["sweeps"][fmt + "_tiles_T1"] = sweep_tiles(arenas, mxfp4)
            save()
            if any("kernels_us" in row for row in sweep):
                configs.append((1, fastest_tiles(sweep)))
        for tokens, config in configs:
            config_used = config or pick_config(tokens * PICKS, mxfp4)
            case = {"format": fmt, "tokens": tokens, "config": repr(config_used), "tuned": config is not None}
            case["path"] = "cuda cores" if config_used.cuda_cores else "matrix units"
            case["check"] = attempt(check, arenas, tokens, config)
            case |= attempt(time_case, arenas, tokens, config)
            if "op_bandwidth" in case:
                case["floor_us"] = case["bytes_read"] / copy * 1e6
                case["fraction_of_copy_bandwidth"] = {
                    key: case[key] / copy
                    for key in ("op_bandwidth", "graph_bandwidth", "projection_kernels_bandwidth")
                    if case[key]
                }
            report["cases"].append(case)
            print_case(case)
            save()
        if mxfp4:
            report["sweeps"]["mxfp4_cuda_cores"] = sweep_cuda_cores(arenas, [t for t in token_counts if t <= 16])
            save()
        if mxfp4 and 1 in token_counts:
            report["sweeps"]["mxfp4_half_pairs_T1"] = sweep_half_pairs(arenas)
            save()
        if tile_sweeps:
            report["sweeps"][fmt + "_pairs_per_tile"] = sweep_pairs_per_tile(arenas, mxfp4)
            save()
        del arenas
        torch.cuda.empty_cache()
    report["compiled"] = attempt(compiled_resources)
    save()
    print(f"wrote {out_path} after {report['seconds']:.0f} s")


def compiled_resources() -> dict:
    """Registers, spills and shared memory of every compiled kernel variant."""
    from app.kernels import expert_tiles, gpt_oss_experts_half_pairs, gpt_oss_experts_triton, mxfp4_half_pairs

    resources = {}
    modules = (gpt_oss_experts_triton, gpt_oss_experts_half_pairs, mxfp4_half_pairs, expert_tiles)
    names = [*KERNELS, "_half_pairs_gate_up_kernel", "_half_pairs_down_kernel"]
    for name in names:
        kernel = next(getattr(m, name) for m in modules if hasattr(m, name))
        for caches in kernel.device_caches.values():
            resources[name] = [
                {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared, "warps": k.metadata.num_warps,
                 "constants": repr(getattr(k.src, "constants", ""))[:300]}
                for k in caches[0].values()
            ]
    return resources


def print_case(case: dict, format_width: int = 5) -> None:
    tuned = " tuned" if case["tuned"] else ""
    title = f"{case['format']:{format_width}} T={case['tokens']:3}{tuned} {case.get('path', '')}"
    if "error" in case:
        print(f"{title} {case['config']}: {case['error'][:500]}", flush=True)
        return
    kernels = {name[1:-7]: round(us, 1) for name, us in case["kernels_us"].items()}
    fractions = {key.split("_")[0]: round(value, 2) for key, value in case["fraction_of_copy_bandwidth"].items()}
    print(
        f"{title} error={case['check'].get('relative_error', case['check'])} op={case['op_us']:.1f}us "
        f"graph={case['graph_us']:.1f}us floor={case['floor_us']:.1f}us kernels={kernels} fractions={fractions}",
        flush=True,
    )


def machine() -> dict:
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
    return {
        "gpu": torch.cuda.get_device_name(),
        "nvidia_smi": subprocess.run(query, capture_output=True, text=True).stdout.strip(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)), help="token counts, comma-separated")
    parser.add_argument("--formats", default="mxfp4,bf16", help="weight formats, comma-separated: mxfp4, bf16")
    parser.add_argument("--no-tile-sweeps", action="store_true", help="skip the matrix-unit tile sweeps")
    args = parser.parse_args()
    formats = args.formats.split(",")
    if not set(formats) <= {"mxfp4", "bf16"}:
        parser.error(f"--formats takes mxfp4 and bf16, not {args.formats!r}")
    main(args.out, [int(t) for t in args.tokens.split(",")], formats, not args.no_tile_sweeps)
