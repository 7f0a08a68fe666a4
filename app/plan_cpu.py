"""The performance model's rates for a CPU as the compute device (no GPU): the desktop app and `moechat plan
--device cpu` predict with the same figures."""

from app.plan import Hardware, LayerOverheads

# As measured decoding the demo model on a 2-core EPYC shared with other work (bench/results/cpu-decode-demo-*.json,
# bench/NOTES.md): the C expert kernels multiply MXFP4 experts at ~12 GFLOP/s at batch 1 (decoding the weights
# bounds them, not memory), float32 matrix-vector products stream ~35 GB/s, and eager torch costs 0.65-1.2 ms a
# layer around them (attention, norms, router: about 75 small ops; the more other work shares the cores, the more),
# 0.85 ms here, whatever the attention (the GPU's extra launches of latent attention are no figure for it). The CPU
# computes every expert already: it is no second expert tier.
CPU_HARDWARE = Hardware(link_bps=10e9, memory_bps=35e9, flops=12e9, cpu_experts=None,
                        overheads=LayerOverheads(resident_s=0.85e-3, graph_s=0.85e-3, segmented_s=0.85e-3,
                                                 latent_attention_s=0.0))
