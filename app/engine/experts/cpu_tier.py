"""The CPU as a second expert tier: in a pass whose misses the device serves (device_misses.py), the host's cores
compute part of each layer call's misses in place in the host store while the device fetches the rest, so the
two finish about together (kernels/cpu_share.py decides on the device from the costs measured here, and hands the
share over; cpu/cpu_share.c serves it on a thread of its own). No host synchronisation joins the step: the thread
watches page-locked memory, and the device waits for its answer."""

import ctypes
import statistics
import threading
import time
import weakref

import torch

from app.engine.experts.store import ExpertStore
from app.kernels.cpu import library as cpu
from app.kernels.cpu_share import DONE, REQUEST, STATUS, STOP, TOKENS, CpuShareBuffers, add_cpu_share, post_cpu_share
from app.kernels.expert_op import ExpertOp
from app.kernels.expert_resolve import Residency

STOP_WAIT_S = 5.0


class CpuTierError(RuntimeError):
    """The host's thread stopped answering the device, or its kernel failed."""


class CpuTier:
    """Computes misses of calls of up to `max_tokens` tokens on `threads` cores. The split weighs `fetch_s`, the
    seconds the device takes to fetch an expert, against `call_costs`, the host's (a call's fixed seconds, a
    (token, expert) pair's), measured here unless given."""

    def __init__(self, store: ExpertStore, op: ExpertOp, hidden_size: int, top_k: int, max_tokens: int,
                 threads: int, device: torch.device, fetch_s: float,
                 call_costs: tuple[float, float] | None = None):
        assert op.on_host is not None and store.all_in_host_memory
        self.store, self.threads = store, threads
        self.buffers = CpuShareBuffers.allocate(max_tokens, top_k, hidden_size, device)
        kernel, self._experts = op.on_host(store.host_arenas())
        b = self.buffers
        self._share = cpu.CpuShare(b.control.data_ptr(), b.slots.data_ptr(), b.weights.data_ptr(), b.x.data_ptr(),
                                   b.out.data_ptr(), top_k, hidden_size, threads, cpu.KERNELS[kernel],
                                   ctypes.addressof(self._experts))
        thread = threading.Thread(target=cpu.library().serve_cpu_share, args=(ctypes.byref(self._share),),
                                  name="cpu-experts", daemon=True)
        thread.start()
        # the thread reads these buffers until it is told to stop: the finalizer holds them until then
        self._stop = weakref.finalize(self, _stop_serving, b.control, thread, self._share, self._experts)
        self.fetch_s = fetch_s
        self.call_s, self.pair_s = call_costs or self.measured_call_costs()
        b.costs.copy_(torch.tensor([fetch_s, self.call_s, self.pair_s]))
        b.ticket.fill_(int(b.control[DONE]))  # the device's tickets go on from the measurements' (a wait is for >=)

    def post(self, layer: int, hidden: torch.Tensor, picks: torch.Tensor, weights: torch.Tensor,
             residency: Residency) -> torch.Tensor:
        """One call's picks [P] -> the picks the device computes itself [P] (the CPU's are -1)."""
        base = self.store.layers.index(layer) * self.store.num_experts
        return post_cpu_share(picks, weights, hidden, layer, base, residency.slot_of, residency.uses,
                              residency.counts, self.buffers)

    def add(self, out: torch.Tensor) -> None:
        add_cpu_share(out, self.buffers)

    def check(self, failed: bool) -> None:
        """Raise if a wait of the device gave up (`failed`, read with the settle) or the host's kernel failed."""
        status = int(self.buffers.control[STATUS])
        if failed or status:
            reason = cpu.STATUS.get(status, f"status {status}") if status else "it stopped answering"
            raise CpuTierError(f"the CPU expert tier failed ({reason}); load the model again with --cpu-threads 0 "
                               "to run without it")

    def close(self) -> None:
        self._stop()

    def measured_call_costs(self, repeats: int = 9, attempts: int = 3) -> tuple[float, float]:
        """(a call's fixed cost, a pair's) in seconds: the host's kernel, through the serving thread, on one token
        picking one expert and three (or k) in turn, the medians of `repeats` calls each after a warm-up; each call
        reads experts of another layer, as decoding does (not ones the last call left in the caches). Three experts
        can only take longer than one: where they did not, something else held the cores (a 25 % run on the H200
        measured a call at 1.58 ms so, which gave the CPU no work), and it measures again, `attempts` times at most."""
        b = self.buffers
        picks = b.slots.numel() // b.x.shape[0]
        counts = sorted({1, min(3, picks)})
        # once, not per call: torch's own threads would spin for a while after it, beside the measured calls
        b.x.normal_()
        b.weights.fill_(1.0)
        for _ in range(attempts):
            samples = {count: [] for count in counts}
            for call in range(repeats + 2):
                for count in counts:
                    samples[count].append(self._timed_call(call % len(self.store.layers), count))
            times = {count: statistics.median(taken[2:]) for count, taken in samples.items()}
            if times[counts[-1]] > times[1] or len(counts) == 1:
                break
        pair = max((times[counts[-1]] - times[1]) / max(counts[-1] - 1, 1), 1e-7)
        return max(times[1] - pair, 0.0), pair

    def _timed_call(self, layer_index: int, count: int) -> float:
        """Seconds for the serving thread to answer a call of one token picking the first `count` experts of the
        host store's `layer_index`-th layer."""
        b = self.buffers
        b.slots.fill_(-1)
        b.slots[:count] = layer_index * self.store.num_experts + torch.arange(count)
        b.control[TOKENS] = 1
        ticket = int(b.control[REQUEST]) + 1
        start = time.perf_counter()
        b.control[REQUEST] = ticket
        while int(b.control[DONE]) < ticket:
            time.sleep(0)
        return time.perf_counter() - start


def measured_fetch_s(store: ExpertStore, device: torch.device, share_of_link: float, repeats: int = 5) -> float:
    """Seconds to fetch one expert: page-locked copies of four experts' bytes to `device` (median of `repeats`),
    divided by the share of the copy engine's rate that the fetch kernel reaches."""
    size = 4 * store.expert_bytes
    source = store.host.buffer[:size]
    target = torch.empty(size, dtype=torch.uint8, device=device)
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        target.copy_(source)  # blocking: a non-blocking copy would leave the host allocator an event on the store
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e-3 / 4)
    return statistics.median(samples) / share_of_link


def _stop_serving(control: torch.Tensor, thread: threading.Thread, *kept) -> None:
    control[STOP] = 1
    thread.join(STOP_WAIT_S)
