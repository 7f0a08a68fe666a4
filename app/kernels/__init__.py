"""Triton and C kernels, each beside its torch reference."""

import os

# Triton 3.9 warns that it stops fusing a * b + c into one FMA by default from 3.10; these kernels were written and
# measured with the fusion (compiled for sm_90 without it, fp8_linear's one-token o_proj has 27 % more instructions:
# a multiply and an add for every product). A user's own setting wins.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
