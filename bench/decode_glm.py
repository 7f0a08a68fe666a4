"""Batch-1 decode of a synthetic GLM-4.5-Air-FP8 checkpoint at GPU budgets that hold 100 %, 50 % and 25 % of
the routed experts, the rest in pinned RAM: what bench/decode_gpt_oss.py measures for gpt-oss, with its helpers
(tok/s, hit rate and bytes fetched per token, the floors from the pinned PCIe and HBM copy bandwidths measured
in the same run, torch.cuda.max_memory_allocated against the budget).

    python bench/decode_glm.py OUT.json [--model glm-4.5-air-fp8|glm-4.7-flash] [--prompt 512] [--new 256]
        [--fractions 1.0,0.5,0.25] [--prefetch 0] [--repeats 2] [--layers 46] [--folder DIR] [--routing uniform]
        [--misses device,host]
    python bench/decode_glm.py OUT.json --device cpu --tiny     (the whole pipeline on the tiny GLM-4.5-FP8
        test checkpoint, in seconds)

The checkpoint (`write_real_size_glm`) has the published config and shapes: compressed-tensors FP8 with an F32
per-output-channel `weight_scale`, the `ignore` list's modules in bf16. Its dense weights are random (attention,
shared experts, dense layer 0, routers with their correction bias, embeddings, LM head), so routing changes from
token to token (yet the cache hit 99.6 % at 50 % on the H200: random routers favour some experts); its
99.8 GB of routed experts are zeros in a sparse file (copy and kernel times do not depend on the values).
No MTP layer: nothing speculates here.
Two decodes per budget, not gpt-oss's three: at 25 % a GLM token misses ~4.7 GB of experts, and the whole
bench must fit one 10-minute device call.

RAM: at 100 % the experts go from the checkpoint's page cache straight to the GPU (RAM budget 0: pinning 99.8 GB
that the run never reads would only lengthen the load); below 100 % every expert is pinned (no RAM budget: any of
them can miss), 99.8 GB, which the one-H200 machine's 128 GiB holds.

No transformers + accelerate peer: transformers reads compressed-tensors FP8 only through the
`compressed-tensors` package, which this project does not depend on; the gpt-oss peer (bench/NOTES.md) measures
what accelerate's offload costs.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.model_folder import ModelFolder
from app.plan import ModelFacts
from bench.decode_gpt_oss import add_protocol_options, budget_runs, copy_bandwidths, cpu_machine, machine, print_table
from tests.fixtures.tiny_glm import GLM_4_5_AIR_FP8_CONFIG, GLM_4_7_FLASH_CONFIG, write_real_size_glm, write_tiny_glm

# --model: the published configs a synthetic checkpoint can take (bf16, or per-channel FP8: write_real_size_glm)
PUBLISHED = {"glm-4.5-air-fp8": ("GLM-4.5-Air-FP8", GLM_4_5_AIR_FP8_CONFIG),
             "glm-4.7-flash": ("GLM-4.7-Flash", GLM_4_7_FLASH_CONFIG)}


def pinned_unless_all_fit(fraction: float) -> int | None:
    """The RAM budget of a run: none (every expert pinned) unless the GPU holds them all."""
    return 0 if fraction >= 1 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tiny", action="store_true", help="the tiny GLM-4.5-FP8 test checkpoint (CPU checks)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--prompt", type=int)
    parser.add_argument("--new", type=int)
    parser.add_argument("--fractions", default="1.0,0.5,0.25")
    parser.add_argument("--prefetch", default="0", help="look-ahead depths to compare, e.g. 0,2")
    parser.add_argument("--repeats", type=int, default=2, help="decodes per budget; the first warms up")
    parser.add_argument("--model", choices=PUBLISHED, default="glm-4.5-air-fp8")
    parser.add_argument("--layers", type=int, help="fewer layers than the published ones, for a shorter check")
    parser.add_argument("--folder", help="reuse a synthetic checkpoint written earlier")
    # hollow experts route degenerately (the cache hit 99.5 % at 50 %), and GLM's published routing is close to
    # uniform: uniform is the honest default (performance.md)
    add_protocol_options(parser, default_routing="uniform")
    args = parser.parse_args()
    args.prompt = args.prompt or (32 if args.tiny else 512)
    args.new = args.new or (16 if args.tiny else 256)
    cuda = args.device == "cuda"

    name, published = PUBLISHED[args.model]
    layers = args.layers or published["num_hidden_layers"]
    model = "tiny GLM-4.5-FP8 (tests/fixtures/tiny_glm.py)" if args.tiny else f"synthetic {name}, {layers} layers"
    report = {"command": " ".join(sys.argv), "machine": machine() if cuda else cpu_machine(), "model": model,
              "experts": "zeros in a sparse file" if not args.tiny else "random"}
    report["bandwidth"] = copy_bandwidths(args.device)
    if cuda:
        torch.cuda.empty_cache()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="glm-", dir="/tmp"))
    if not (folder / "config.json").exists():
        started = time.perf_counter()
        if args.tiny:
            write_tiny_glm(folder, "glm4_moe_fp8", mtp=False)
        else:
            write_real_size_glm(folder, {**published, "num_hidden_layers": layers})
        report["checkpoint_write_s"] = time.perf_counter() - started
        print(f"checkpoint written in {report['checkpoint_write_s']:.0f} s", flush=True)
    facts = ModelFacts.from_folder(ModelFolder.open(folder), fp8_kept=cuda)  # as the engine keeps its dense FP8
    report.update(expert_bytes=facts.expert_bytes, total_experts=facts.total_experts, moe_layers=len(facts.moe_layers),
                  resident_weights=facts.resident_weights, resident_fp8_bytes=facts.resident_fp8_bytes,
                  dense_fp8_kept=facts.fp8_kept)
    budget_runs(report, folder, facts, args, args.device, pinned_unless_all_fit)
    print_table(report)


if __name__ == "__main__":
    main()
