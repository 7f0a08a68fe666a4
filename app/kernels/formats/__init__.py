"""The checkpoint formats the kernels read, decoded in torch: FP8 e4m3 with its scales and GPT-OSS's MXFP4. The
kernels' torch references use them, and so does the engine where it dequantizes at load."""
