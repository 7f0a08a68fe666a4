"""How fast a GPU kernel reads page-locked host memory in place (zero-copy), against the copy engine, for the
expert cache's choice between reading a missed expert in place and copying it first (app/engine/experts/cache.py).

    python bench/zero_copy.py OUT.json

Host buffers of 1 GiB: torch's allocation registered with the driver (as the expert store is), the same
advised to use transparent huge pages before it is touched, and torch's own pinned allocation. A Triton kernel
sums the buffer 16 bytes a lane (as the expert kernels load), at several program sizes; the copy engine copies
it in 13 MB chunks. Also one gpt-oss-20b expert's single-token product read from a cache slot and from the host.
"""

import ctypes
import json
import mmap
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.weights.host_memory import REGISTER_FLAGS
from app.kernels.expert_table import device_addresses, slot_table
from app.kernels.gpt_oss_experts_triton import run_from_table
from bench.decode_gpt_oss import machine, median_seconds

SIZE = 1 << 30
MADV_HUGEPAGE = 14


@triton.jit
def _sum_kernel(source_ptr, out_ptr, words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    start = tl.program_id(0) * BLOCK * STEPS
    acc = tl.zeros((BLOCK, 4), tl.int32)
    lane = tl.arange(0, BLOCK)[:, None] * 4 + tl.arange(0, 4)[None, :]
    for step in tl.static_range(STEPS):
        at = start * 4 + step * BLOCK * 4 + lane
        acc += tl.load(source_ptr + at, mask=at < words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.sum(acc, 1), 0))


def registered(buffer: torch.Tensor) -> torch.Tensor:
    error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), REGISTER_FLAGS)
    assert int(error) == 0, error
    return buffer


def huge_page_buffer() -> torch.Tensor:
    region = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    advised = libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(SIZE), MADV_HUGEPAGE)
    buffer = torch.frombuffer(region, dtype=torch.uint8)
    buffer.fill_(1)
    buffer.region = region  # keep the mapping alive with the tensor
    buffer.advised = advised
    return buffer


def read_bandwidths(buffer: torch.Tensor) -> dict:
    words = buffer.numel() // 4
    source = buffer.view(torch.int32)
    results = {}
    for block, steps in ((128, 4), (256, 4), (256, 16), (512, 8), (1024, 4)):
        programs = triton.cdiv(words, block * steps * 4)
        out = torch.empty(programs, dtype=torch.int32, device="cuda")
        launch = _sum_kernel[(programs,)]
        seconds = median_seconds(lambda launch=launch, out=out, block=block, steps=steps: launch(source, out, words,
                                                                                        BLOCK=block, STEPS=steps))
        results[f"block{block}x{steps}"] = buffer.numel() / seconds
    device = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
    chunk = 13_240_000

    def copies():
        for first in range(0, SIZE - chunk, chunk):
            device[first : first + chunk].copy_(buffer[first : first + chunk], non_blocking=True)

    results["copy_engine_13MB_chunks"] = (SIZE - SIZE % chunk) / median_seconds(copies)
    return results


def expert_read(pinned: torch.Tensor) -> dict:
    """One gpt-oss-20b expert's single-token products, its weights in a slot or in host memory."""
    hidden, width = 2880, 2880
    shapes = {"gate_up_proj_blocks": (2 * width, hidden // 32, 16), "gate_up_proj_scales": (2 * width, hidden // 32),
              "gate_up_proj_bias": (2 * width,), "down_proj_blocks": (hidden, width // 32, 16),
              "down_proj_scales": (hidden, width // 32), "down_proj_bias": (hidden,)}
    dtypes = {"gate_up_proj_bias": torch.bfloat16, "down_proj_bias": torch.bfloat16}
    arenas, host, offset = {}, {}, 0
    for name, shape in shapes.items():
        dtype = dtypes.get(name, torch.uint8)
        numel = torch.Size(shape).numel() * (2 if dtype == torch.bfloat16 else 1)
        host[name] = pinned[offset : offset + numel].view(dtype).view(shape)
        offset += -(-numel // 512) * 512
        arenas[name] = torch.randint(119, 125, (1, *shape), dtype=torch.uint8, device="cuda").view(dtype) \
            if dtype == torch.uint8 else torch.randn(1, *shape, device="cuda").to(dtype)
        host[name].copy_(arenas[name][0].cpu())
    host_row = torch.tensor([device_addresses([t], torch.device("cuda"))[0] for t in host.values()]).cuda()
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    rows, weights = torch.zeros(1, 1, dtype=torch.long, device="cuda"), torch.ones(1, 1, device="cuda")
    in_slot = median_seconds(lambda: run_from_table(x, arenas, slot_table(arenas), rows, weights, 7.0, 1.702), True, 20)
    in_host = median_seconds(lambda: run_from_table(x, arenas, host_row[None], rows, weights, 7.0, 1.702), True, 20)
    expert_bytes = sum(t.numel() * t.element_size() for t in host.values())
    return {"expert_bytes": expert_bytes, "slot_s": in_slot, "host_s": in_host, "host_Bps": expert_bytes / in_host}


def main() -> None:
    report = {"command": " ".join(sys.argv), "machine": machine(),
              "transparent_hugepage": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()}
    started = time.perf_counter()
    plain = registered(torch.ones(SIZE, dtype=torch.uint8))
    report["registered_torch_allocation"] = read_bandwidths(plain)
    huge = registered(huge_page_buffer())
    report["registered_huge_pages"] = {"madvise": huge.advised, **read_bandwidths(huge)}
    report["torch_pin_memory"] = read_bandwidths(torch.ones(SIZE, dtype=torch.uint8).pin_memory())
    report["expert_from_registered"] = expert_read(plain)
    report["expert_from_huge_pages"] = expert_read(huge)
    report["seconds"] = time.perf_counter() - started
    Path(sys.argv[1]).write_text(json.dumps(report, indent=2))
    for key, value in report.items():
        print(key, json.dumps(value) if isinstance(value, dict) else value)


if __name__ == "__main__":
    main()
