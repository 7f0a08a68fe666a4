"""The C SiLU-gated experts (app/kernels/cpu/glu_experts.c) against the torch reference, in float32: FP8 with a
scale per row or per block (partial last blocks, column tails of every width the C steps take), bf16 and float32."""

import pytest
import torch

from app.kernels.glu_experts import glu_experts_cpu, glu_experts_op, glu_experts_torch
from tests.fixtures.tiny_glm import quantize_fp8
from tests.kernels.cpu_kernels import in_strided_slots
from tests.kernels.test_gpt_oss_experts import random_routing, relative_error

pytestmark = pytest.mark.usefixtures("built_library")

SLOTS = 6


def random_arenas(fmt: str, hidden: int, width: int, block: tuple[int, int] | None,
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Arenas as a GLM expert cache holds them: fmt "fp8" (block scales, or per-row ones when block is None),
    "bf16" or "f32"."""
    shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
    arenas = {}
    for name, (out, inputs) in shapes.items():
        masters = [torch.randn(out, inputs, generator=generator) / inputs**0.5 for _ in range(SLOTS)]
        if fmt != "fp8":
            arenas[f"{name}.weight"] = torch.stack(masters).to(torch.bfloat16 if fmt == "bf16" else torch.float32)
            continue
        stored = [quantize_fp8(master, list(block) if block else None) for master in masters]
        arenas[f"{name}.weight"] = torch.stack([weight for weight, _ in stored])
        arenas[f"{name}.weight_scale_inv" if block else f"{name}.weight_scale"] = torch.stack([s for _, s in stored])
    return arenas


# (format, hidden, width, block): 200 and 136 leave a step of 8 after AVX2's steps of 32 and a scalar tail of 8 after
# AVX-512's steps of 64, 70 and 45 scalar tails (45: after AVX-512's steps of 16); blocks of 32 and 128 end partial (the
# last row and column of blocks cover fewer rows and columns)
FORMATS = [("fp8", 200, 136, (128, 128)), ("fp8", 70, 45, (32, 32)), ("fp8", 200, 136, None), ("fp8", 70, 45, None),
           ("bf16", 200, 136, None), ("f32", 70, 45, None)]


@pytest.mark.parametrize(("fmt", "hidden_size", "width", "block"), FORMATS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 16])
def test_kernel_matches_reference(fmt, hidden_size, width, block, tokens, vector_path, threads):
    generator = torch.Generator().manual_seed(tokens * 100 + hidden_size + width)
    arenas = random_arenas(fmt, hidden_size, width, block, generator)
    slots, weights = random_routing(tokens, 4, SLOTS, generator)
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    out = glu_experts_cpu(hidden, arenas, slots, weights, fp8_block=block)
    ref = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=block)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert relative_error(out, ref) < 2e-6
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert ref.abs().max() > 0.01
    if tokens > 1:
        assert (out[1] == 0).all()  # all its picks skipped


def test_slots_read_in_place_with_room_between_them(vector_path):
    generator = torch.Generator().manual_seed(4)
    arenas = random_arenas("fp8", 200, 136, (128, 128), generator)
    slots, weights = random_routing(7, 4, SLOTS, generator)
    hidden = torch.randn(7, 200, generator=generator)
    out = glu_experts_cpu(hidden, in_strided_slots(arenas), slots, weights, fp8_block=(128, 128))
    assert relative_error(out, glu_experts_torch(hidden, arenas, slots, weights, fp8_block=(128, 128))) < 2e-6


def test_every_fp8_value_decodes_as_torch_decodes_it(vector_path):
    """All 254 finite e4m3 codes (subnormals, both zeros, ±448) as one expert's weights, identity elsewhere."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # 0x7F, 0xFF: NaN
    hidden, width = 32, len(codes)
    arenas = random_arenas("fp8", hidden, width, None, torch.Generator().manual_seed(0))
    arenas["gate_proj.weight"][0] = codes.view(torch.float8_e4m3fn)[:, None].expand(width, hidden)
    arenas["gate_proj.weight_scale"][0] = 1.0
    ref = glu_experts_torch(torch.ones(1, hidden), arenas, torch.tensor([[0]]), torch.ones(1, 1))
    out = glu_experts_cpu(torch.ones(1, hidden), arenas, torch.tensor([[0]]), torch.ones(1, 1))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_op_on_the_cpu_is_the_c_kernel(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert glu_experts_op(torch.device("cpu")) is glu_experts_cpu
