"""What bounds one token's MXFP4 expert op (gpt_oss_experts_half_pairs.py) on a CUDA GPU, at gpt-oss-20b's shapes.

    python3 bench/mxfp4_one_token_bounds.py OUT.json        (MOECHAT_PDL=0: every launch without dependent launches)

Every case runs in a CUDA graph cycling through 8 disjoint routings of 4 picks among 32 experts in slots (each replay
reads its experts from DRAM), as bench/kernel_gpt_oss_experts.py times the op:
- `parts`: the op as a resident decode runs it (rows that are the arenas' slots, the inputs in float16 pairs from
  the norm before: norms.add_rms_norm_half_pairs, the picks' rows left for the norm after to add: pick_rows.py), the
  op with its own conversion of the inputs (and its picks' sum), the op reading its experts through the address table
  (as for experts outside the slots), then its launches alone or in part (the inputs' conversion, gate_up, down, the
  picks' sum);
- `loads only`: the op's own kernels with their products taken out (a lane's words XORed with its inputs, the scale
  bytes added): what the programs' loads alone take; with `no inputs` the inputs' loads are gone too, with `no scales`
  the scale bytes. Made at run time from the kernels' source (written to a temporary folder and imported), so they
  follow the kernels as they are;
- `streams`: programs that only read the 4 picks' gate_up words (what gate_up reads, less its scales, biases and
  inputs), a program per (pick, rows) with the warps and rows of each shape, in the picks' slots as the op reads
  them: the bandwidth a program shape can reach at all. They let the next launch start early
  (`after_earlier_kernels`), as the op's kernels did before the thirty-first session (bench/NOTES.md).
Floor = bytes / device-to-device copy bandwidth (read + written), measured in the same run.
"""

import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the repository root

from app.kernels import gpt_oss_experts_half_pairs, mxfp4_half_pairs
from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.expert_table import columns, slot_table
from app.kernels.expert_tiles import sum_picks
from app.kernels.gpt_oss_experts_half_pairs import down_in_half_pairs, gate_up_in_half_pairs
from app.kernels.gpt_oss_experts_triton import pick_config
from app.kernels.mxfp4_half_pairs import half_pairs
from bench.decode_gpt_oss import machine
from bench.kernel_gpt_oss_experts import (
    ALPHA,
    HIDDEN,
    LIMIT,
    NUM_SLOTS,
    PICKS,
    WIDTH,
    bytes_read,
    copy_bandwidth,
    make_arenas,
    make_routing,
)

STREAM_SHAPES = ((2, 1), (4, 1), (8, 1), (8, 4), (16, 8), (32, 8))  # (rows, warps) a program

PRODUCTS = """    words0, words1, words2, words3 = _four(words4)
    sums = tl.zeros(acc.shape, tl.uint32)  # float16 pairs: a group's 16 products per half"""
LOADS_ONLY = """    mixed = (words4 ^ x0.to(tl.uint32, bitcast=True) ^ x1.to(tl.uint32, bitcast=True)
             ^ x2.to(tl.uint32, bitcast=True) ^ x3.to(tl.uint32, bitcast=True))
    return acc + (tl.sum(mixed, axis=2) & 0xFF).to(tl.float32) + scale.to(tl.float32)
"""
INPUT_LOADS = [f"    x{i} = _over_rows(_load(pairs_at{' + GROUPS * ' + str(4 * i) if i else ''}, x_ok, full), BLOCK_N)"
               for i in range(4)]
SCALE_LOAD = ("    scale = _load(scale_ptr + scales_at, (rows[:, None] < N) & (group[None, :] < GROUPS), "
              "full and N % BLOCK_N == 0)")


def loads_only_module(folder: Path, name: str, inputs: bool, scales: bool):
    """gpt_oss_experts_half_pairs with its products taken out (and the inputs' or scales' loads), as a module."""
    source = Path(mxfp4_half_pairs.__file__).read_text()
    for piece in (PRODUCTS, SCALE_LOAD, *INPUT_LOADS):
        assert piece in source, f"mxfp4_half_pairs.py changed: update this bench ({piece.strip()[:60]})"
    source = source.replace(PRODUCTS, LOADS_ONLY + PRODUCTS)
    if not inputs:
        source = source.replace(INPUT_LOADS[0], "    x0 = _over_rows(word[None, :], BLOCK_N)")
        for line in INPUT_LOADS[1:]:
            source = source.replace(line, f"    {line.split('=')[0].strip()} = x0")
    if not scales:
        source = source.replace(SCALE_LOAD, "    scale = (rows[:, None] + group[None, :]).to(tl.uint8)")
    (folder / f"{name}_products.py").write_text(source)
    experts = Path(gpt_oss_experts_half_pairs.__file__).read_text()
    (folder / f"{name}.py").write_text(experts.replace("app.kernels.mxfp4_half_pairs", f"{name}_products"))
    return importlib.import_module(name)


@triton.jit
def _stream_kernel(rows_ptr, words_base, out_ptr, N: tl.constexpr, WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
                   PDL: tl.constexpr):
    """A program per (pick, BLOCK_N rows) reads its rows' words (lanes along a row, 128 words a step) in the pick's
    slot and keeps an XOR of them."""
    after_earlier_kernels(PDL)
    pair = tl.program_id(0)
    words = words_base + tl.load(rows_ptr + pair).to(tl.int64) * (N * WORDS)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, 128), tl.int32)
    for step in tl.static_range(triton.cdiv(WORDS, 128)):
        at = step * 128 + tl.arange(0, 128)
        acc ^= tl.load(words + rows[:, None] * WORDS + at[None, :], mask=at[None, :] < WORDS, other=0)
    tl.store(out_ptr + pair * N + rows, tl.sum(acc, axis=1))


def main(out_path: str) -> None:
    started = time.time()
    torch.manual_seed(0)
    copy = copy_bandwidth()
    arenas = make_arenas(True)
    table, names = slot_table(arenas), columns(arenas)
    hidden = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    order = torch.randperm(NUM_SLOTS, device="cuda").view(8, 1, PICKS)
    routings = [(order[i], make_routing(1)[1]) for i in range(8)]
    op_bytes = statistics.mean(bytes_read(arenas, slots) for slots, _ in routings)
    gate_up_words = arenas["gate_up_proj_blocks"].view(torch.int32)  # [S, 2W, H/32, 4]
    words_bytes = PICKS * gate_up_words[0].numel() * 4
    report = {"machine": machine(), "command": "python3 " + " ".join(sys.argv),
              "dependent_launches": os.environ.get("MOECHAT_PDL", "1") != "0",
              "shapes": {"hidden": HIDDEN, "width": WIDTH, "slots": NUM_SLOTS, "picks": PICKS,
                         "routing": "uniform random, 8 disjoint sets of 4 experts cycled"},
              "copy_bandwidth": copy, "floor": "bytes / copy bandwidth (read + write counted)",
              "op_floor_us": op_bytes / copy * 1e6, "gate_up_words_floor_us": words_bytes / copy * 1e6, "cases": []}

    def timed(group: str, name: str, launch, floor_us: float | None = None) -> None:
        calls = iter(range(10**9))

        def rotating():
            slots, weights = routings[next(calls) % len(routings)]
            launch(slots, weights)

        rotating()
        graph_us = [do_bench_cudagraph(rotating, rep=20, return_mode="median") * 1e3 for _ in range(2)]
        case = {"group": group, "name": name, "graph_us": graph_us}
        if floor_us:
            case["fraction_of_floor"] = floor_us / min(graph_us)
        report["cases"].append(case)
        report["seconds"] = time.time() - started
        Path(out_path).write_text(json.dumps(report, indent=1))
        print(f"{group:>10} {name:<40} {min(graph_us):7.2f} us {case.get('fraction_of_floor', '')}", flush=True)

    op_floor = report["op_floor_us"]
    config = pick_config(PICKS, mxfp4=True)  # one token's picks: the float16-pair programs
    tiles = (config.gate_up, config.down)
    x, x_unscale = half_pairs(hidden)
    activations = gate_up_in_half_pairs(x, x_unscale, arenas, None, routings[0][0], LIMIT, ALPHA, names, tiles[0])
    per_pick = down_in_half_pairs(activations, arenas, None, routings[0][0], routings[0][1], LIMIT, names, tiles[1])

    def op(module, through=None, hidden_pairs=None):
        return lambda slots, weights: module.run_in_half_pairs(hidden, arenas, through, slots, weights, LIMIT, ALPHA,
                                                               names, tiles, hidden_pairs)

    def gate_up(slots, weights):
        gate_up_in_half_pairs(x, x_unscale, arenas, None, slots, LIMIT, ALPHA, names, tiles[0])

    def down(slots, weights):
        down_in_half_pairs(activations, arenas, None, slots, weights, LIMIT, names, tiles[1])

    timed("parts", "op", op(gpt_oss_experts_half_pairs, hidden_pairs=(x, x_unscale)), op_floor)
    timed("parts", "op converting its inputs", op(gpt_oss_experts_half_pairs), op_floor)
    timed("parts", "op through the address table", op(gpt_oss_experts_half_pairs, table), op_floor)
    timed("parts", "conversion + gate_up + down", lambda s, w: (half_pairs(hidden), gate_up(s, w), down(s, w)))
    timed("parts", "gate_up + down", lambda s, w: (gate_up(s, w), down(s, w)))
    timed("parts", "gate_up", gate_up)
    timed("parts", "down", down)
    timed("parts", "conversion", lambda s, w: half_pairs(hidden))
    timed("parts", "sum of the picks", lambda s, w: sum_picks(per_pick, s, torch.bfloat16))
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, folder)
        for name, inputs, scales in (("loads_only", True, True), ("loads_only_no_inputs", False, True),
                                     ("loads_only_no_inputs_no_scales", False, False)):
            module = loads_only_module(Path(folder), name, inputs, scales)
            timed("loads only", name.replace("_", " "), op(module, hidden_pairs=(x, x_unscale)), op_floor)
        sys.path.remove(folder)
    out = torch.empty(PICKS * gate_up_words.shape[1], dtype=torch.int32, device="cuda")
    rows, words = gate_up_words.shape[1], gate_up_words[0].numel() // gate_up_words.shape[1]
    pdl = dependent_launch(hidden.device)
    for block_n, warps in STREAM_SHAPES:
        timed("streams", f"{block_n} rows, {warps} warps a program", lambda s, w, b=block_n, nw=warps: _stream_kernel[
            (PICKS, rows // b)](s, gate_up_words, out, N=rows, WORDS=words, BLOCK_N=b, num_warps=nw, **pdl),
              report["gate_up_words_floor_us"])
    print(f"wrote {out_path} after {time.time() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
