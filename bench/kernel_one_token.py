"""The single-token kernels on a CUDA GPU at GLM-4.5-Air's shapes: FP8 dense products and SiLU-gated routed
experts as rows times one vector (app/kernels/rows_times_vector_triton.py), against the tensor-core tiles they
replace at T = 1.

    python3 bench/kernel_one_token.py OUT.json [--registers | --defaults] [--experts]

Dense (fp8_linear_triton.run_one_token): a layer's products as the engine stacks them (q/k/v 14336 × 4096, o
4096 × 12288 with the residual add, the shared expert's gate + up 2816 × 4096 with SiLU * up, its down 4096 × 1408
with the residual), with per-channel scales (GLM-4.5-Air-FP8) and 128 × 128 block scales (GLM-5). Each is timed in
a CUDA graph that cycles through copies of the weight exceeding the L2, as a decode step reads each weight once;
`tiles` is the path it replaces (pick_tiles at T = 1, split-K and the finishing launch) in the same way.
Experts (glu_experts_one_token.py): all 128 experts of a layer in slots, 8 picks, each kernel timed by the profiler
(L2 flushed) on 8 disjoint routings, and the whole op in a CUDA graph cycling through them (the profiler counts a
dependent launch's wait for the kernel before it as its own time: dependent_launch.py); `tiles` is the tile plan's
path (pick_config). Both sweep rows per program × inputs per step × warps; with --registers, the defaults (and
wider experts) under register caps (REGISTER_CAPS) instead; with --defaults, the default tiles alone (a tree against
another in one device call, bench/h200_trees.sh); with --experts, the experts alone. Floor = bytes /
device-to-device copy bandwidth (read + write) measured in the same run.
"""

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels import glu_experts_one_token
from app.kernels.expert_table import columns, slot_table
from app.kernels.fp8_linear import fp8_linear_torch
from app.kernels.fp8_linear_triton import one_token_tiles, pick_tiles, run_fp8_linear, run_one_token
from app.kernels.glu_experts import glu_experts_torch
from app.kernels.glu_experts_triton import Projection, pick_config, run_experts
from app.kernels.rows_times_vector_triton import RowTiles
from bench.kernel_fp8_linear import L2_EXCEEDED, make_weight
from bench.kernel_glu_experts import HIDDEN, NUM_SLOTS, PICKS, make_arenas, make_routing
from bench.kernel_gpt_oss_experts import attempt, bytes_read, kernel_times, start_report
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_gpt_oss_experts import relative_error

DENSE = {  # (out, in, epilogue) as the engine runs them at decode
    "qkv": (14336, 4096, None), "o": (4096, 12288, "residual"),
    "shared_gate_up": (2816, 4096, "glu"), "shared_down": (4096, 1408, "residual"),
}
FORMATS = {"fp8-per-channel": None, "fp8-block128": (128, 128)}
# (rows, inputs a step, warps, fold): the first sweep's best at fold 1 (a thread's float32 sum holds as many values as
# it has weights in a step, so 64 of them at most), then folds of 16 with more weights a thread; a GLU's gate and up
# rows make twice the rows
SWEEP = [RowTiles(*t) for t in (
    (4, 512), (8, 256), (4, 512, 1, 16), (8, 512, 1, 16), (16, 512, 1, 16),
    (8, 1024, 1, 16), (16, 512, 2, 16), (8, 512, 2, 16), (4, 1024, 1, 16), (16, 1024, 2, 16))]
GLU_SWEEP = [RowTiles(*t) for t in (
    (4, 512, 2), (2, 512), (4, 512, 4), (2, 512, 1, 16), (4, 512, 1, 16),
    (8, 512, 1, 16), (4, 1024, 1, 16), (8, 512, 2, 16), (2, 1024, 1, 16), (8, 1024, 2, 16))]


OWN_TILES = "its own tiles"  # the default tiles of the tree that runs the benchmark, as the engine gets them

# at most this many registers a thread (None: ptxas's choice): the defaults used 128-244 and ran 11-21 % occupied
REGISTER_CAPS = (None, 128, 96, 80, 64)
WIDER_EXPERTS = ((RowTiles(16, 1024, 4, 16), RowTiles(16, 512, 4, 16)),
                 (RowTiles(8, 1024, 4, 16), RowTiles(8, 512, 4, 16)))


def capped(tiles: RowTiles) -> list[RowTiles]:
    return [replace(tiles, registers=cap) for cap in REGISTER_CAPS]


def dense_sweep(name: str, sweep: str) -> list[RowTiles | str | None]:
    """None is the tiled path it replaced; OWN_TILES, the tiles run_one_token picks itself."""
    _, inputs, epilogue = DENSE[name]
    if sweep == "defaults":
        return [OWN_TILES]
    if sweep == "register caps":
        return capped(one_token_tiles(inputs, epilogue == "glu"))
    return [None, *(GLU_SWEEP if epilogue == "glu" else SWEEP)]


def expert_sweep(fmt: str, sweep: str, gate_weight: torch.Tensor) -> list[tuple[RowTiles, RowTiles] | None]:
    if sweep == "defaults":  # the engine's own choice for these weights (16-bit ones, FP8 as bytes)
        return [glu_experts_one_token.default_tiles(gate_weight)]
    if sweep == "register caps":
        pairs = [(glu_experts_one_token.GATE_UP, glu_experts_one_token.DOWN), *WIDER_EXPERTS]
        return [(gate_up, down) for pair in pairs for gate_up, down in zip(*(capped(t) for t in pair), strict=True)]
    pairs = list(zip(GLU_SWEEP, SWEEP, strict=True))
    return [None, *(pairs[:1] if fmt == "bf16" else pairs)]


def dense_case(name: str, block, tiles: RowTiles | str | None) -> dict:
    """One product's check and graph time: rows times one vector with `tiles` (its own for OWN_TILES), or the tiled
    path for None."""
    out_features, inputs, epilogue = DENSE[name]
    weight, scale = make_weight(out_features, inputs, block)
    x = torch.randn(1, inputs, device="cuda").bfloat16()
    glu = epilogue == "glu"
    residual = torch.randn(1, out_features, device="cuda").bfloat16() if epilogue == "residual" else None
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    tiled = pick_tiles(1, out_features, inputs, sm_count)

    def product(w, s):
        if tiles is None:
            return run_fp8_linear(x, w, s, block, tiled, glu, residual)
        return run_one_token(x, w, s, block, glu, residual, None if tiles == OWN_TILES else tiles)

    with poisoned_allocations():
        out = product(weight, scale)
    ref = fp8_linear_torch(x.float(), weight, scale, block, glu, None if residual is None else residual.float())
    copies = [(weight, scale)] + [(weight.clone(), scale.clone()) for _ in range(L2_EXCEEDED // weight.nbytes)]
    calls = itertools.count()
    graph_ms = do_bench_cudagraph(lambda: product(*copies[next(calls) % len(copies)]), rep=20, return_mode="median")
    moved = weight.nbytes + scale.nbytes + x.nbytes + out.nbytes * (1 if residual is None else 2)
    return {"relative_error": relative_error(out, ref), "graph_us": graph_ms * 1e3, "bytes_read": moved}


def expert_case(arenas, fmt: str, tiles: tuple[RowTiles, RowTiles] | None) -> dict:
    """The experts' check and kernel times: rows times one vector with `tiles` (gate_up, down), or the tile plan."""
    block = FORMATS.get(fmt)
    table, names = slot_table(arenas), columns(arenas)
    projections = tuple(Projection.of(arenas, name, block) for name in ("gate_proj", "up_proj", "down_proj"))
    hidden = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    order = torch.randperm(NUM_SLOTS, device="cuda")[: 8 * PICKS].view(8, 1, PICKS)
    _, weights = make_routing(1)

    def op(slots):
        if tiles is None:
            return run_experts(hidden, arenas, slots, weights, block, pick_config(PICKS))
        return glu_experts_one_token.run_one_token(hidden, projections, table, slots, weights, names, tiles)

    with poisoned_allocations():
        out = op(order[0])
    ref = glu_experts_torch(hidden.float(), arenas, order[0], weights.float(), block)
    calls = itertools.count()
    kernels = kernel_times(lambda: op(order[next(calls) % 8]), runs=16)
    graph_ms = do_bench_cudagraph(lambda: op(order[next(calls) % 8]), rep=20, return_mode="median")
    return {"relative_error": relative_error(out, ref), "kernels_us": kernels, "graph_us": graph_ms * 1e3,
            "bytes_read": bytes_read(arenas, order[0])}


def main(out_path: str, sweep: str, experts_only: bool) -> None:
    report, save = start_report(out_path, {"dense": DENSE, "experts": {"hidden": HIDDEN, "picks": PICKS},
                                           "sweep": sweep})
    report["floor"] = "bytes (weights, scales, x, outputs, residual) / copy bandwidth (read + write counted)"
    copy = report["copy_bandwidth"]
    for fmt, block in {} if experts_only else FORMATS.items():
        for name in DENSE:
            for tiles in dense_sweep(name, sweep):
                case = {"kind": "dense", "format": fmt, "weight": name, "tiles": repr(tiles) if tiles else "tiles"}
                case |= attempt(dense_case, name, block, tiles)
                if "graph_us" in case:
                    case["fraction_of_floor"] = case["bytes_read"] / copy / (case["graph_us"] * 1e-6)
                report["cases"].append(case)
                print(f"{fmt:15} {name:14} {case['tiles']:72} {case.get('graph_us', 0):6.1f} us "
                      f"{case.get('fraction_of_floor', 0):.2f} err {case.get('relative_error', case.get('error'))}",
                      flush=True)
                save()
    for fmt in ("fp8-per-channel", "fp8-block128") + (() if sweep == "register caps" else ("bf16",)):
        arenas = make_arenas(fmt)
        for tiles in expert_sweep(fmt, sweep, arenas["gate_proj.weight"]):
            case = {"kind": "experts", "format": fmt, "tiles": repr(tiles) if tiles else "tiles"}
            case |= attempt(expert_case, arenas, fmt, tiles)
            if "kernels_us" in case:
                projections = case["kernels_us"].get("_gate_up_kernel", 0) + case["kernels_us"].get("_down_kernel", 0)
                case["fraction_of_floor"] = case["bytes_read"] / copy / (projections * 1e-6)
                case["graph_fraction_of_floor"] = case["bytes_read"] / copy / (case["graph_us"] * 1e-6)
            report["cases"].append(case)
            print(f"{fmt:15} experts {case['tiles'][:120]:120} {case.get('kernels_us', case.get('error'))} "
                  f"{case.get('fraction_of_floor', 0):.2f} graph {case.get('graph_us', 0):.1f} us "
                  f"{case.get('graph_fraction_of_floor', 0):.2f}", flush=True)
            save()
        del arenas
        torch.cuda.empty_cache()
    save()
    print(f"wrote {out_path} after {report['seconds']:.0f} s")


if __name__ == "__main__":
    options = sys.argv[2:]
    chosen = "register caps" if "--registers" in options else "defaults" if "--defaults" in options else "tiles"
    main(sys.argv[1], chosen, "--experts" in options)
