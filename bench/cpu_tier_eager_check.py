"""The CPU expert tier on a GPU, eager: a tiny gpt-oss offloaded to 5 expert slots decodes with and without the tier
(costs that give the CPU about half of each call's misses), step by step through `model.forward` (no CUDA graph),
and prints each step's largest logit difference and greedy tokens. What bench/NOTES.md's CPU-tier section quotes.

    python bench/cpu_tier_eager_check.py   # on the GPU machine, with the CPU kernels built
"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.engine.test_device_misses_cuda import PROMPT, offloaded
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss

STEPS = 6


def step_logits(folder: Path, cpu_threads: int) -> list[torch.Tensor]:
    loaded = offloaded(folder, 5, cpu_threads=cpu_threads)
    model = loaded.model
    if cpu_threads:
        model.experts.device_misses.cpu_tier.buffers.costs.copy_(torch.tensor([1.0, 0.0, 1.0]))
    logits = []
    with torch.inference_mode():
        cache = model.new_kv_cache(64)
        logits.append(model.forward(torch.tensor(PROMPT, device="cuda"), cache)[-1].float().cpu())
        for _ in range(STEPS):
            token = torch.tensor([int(logits[-1].argmax())], device="cuda")
            logits.append(model.forward(token, cache)[-1].float().cpu())
            model.experts.settle()
    stats = model.experts.stats
    print(f"cpu threads {cpu_threads}: {stats.cpu_computed} of {stats.misses} misses computed on the CPU")
    return logits


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="tiny-gpt-oss-"))
    write_tiny_gpt_oss(folder)
    without, with_tier = step_logits(folder, 0), step_logits(folder, 1)
    for step, (a, b) in enumerate(zip(without, with_tier, strict=True)):
        print(f"step {step}: largest difference {float((a - b).abs().max()):.2e} of {float(a.abs().max()):.2f}, "
              f"tokens {int(a.argmax())} / {int(b.argmax())}")


if __name__ == "__main__":
    main()
