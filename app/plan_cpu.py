"""The performance model's rates for a CPU as the compute device (no GPU): the desktop app and `moechat plan
--device cpu` predict with the same figures."""

from app.plan import Hardware, LayerOverheads

# A desktop CPU: dual-channel DDR5, copies inside RAM, a few AVX cores; eager torch layers cost ~4 ms each
# there (the demo model on a 2-core CPU, bench/results/demo-model-cpu-*.json).
CPU_HARDWARE = Hardware(link_bps=10e9, memory_bps=60e9, flops=1e12, overheads=LayerOverheads(4e-3, 4e-3))
