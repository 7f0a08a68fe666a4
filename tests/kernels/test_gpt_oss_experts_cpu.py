"""The C GPT-OSS experts (app/kernels/cpu/gpt_oss_experts.c) against the torch reference, in float32."""

import pytest
import torch

from app.kernels.gpt_oss_experts import gpt_oss_experts_cpu, gpt_oss_experts_op, gpt_oss_experts_torch
from tests.kernels.cpu_kernels import in_strided_slots
from tests.kernels.test_gpt_oss_experts import ALPHA, LIMIT, random_arenas, random_routing, relative_error

pytestmark = pytest.mark.usefixtures("built_library")

# 4160: more blocks a row than the AVX-512 tile scales at once
GRID = [(tokens, picks, num_slots, hidden) for tokens in (1, 2, 3, 8, 9, 16) for picks, num_slots in ((4, 9), (2, 4))
        for hidden in (96, 160)] + [(40, 4, 9, 96), (2, 4, 9, 4160)]


@pytest.mark.parametrize(("tokens", "picks", "num_slots", "hidden_size"), GRID)
def test_kernel_matches_reference(tokens, picks, num_slots, hidden_size, vector_path, threads):
    generator = torch.Generator().manual_seed(tokens * 1000 + picks * 100 + num_slots * 10 + hidden_size)
    arenas = random_arenas(num_slots, True, generator, hidden_size)
    slots, weights = random_routing(tokens, picks, num_slots, generator)
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    out = gpt_oss_experts_cpu(hidden, arenas, slots, weights, LIMIT, ALPHA)
    ref = gpt_oss_experts_torch(hidden, arenas, slots, weights, LIMIT, ALPHA)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert relative_error(out, ref) < 2e-6
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert ref.abs().max() > 0.1
    if tokens > 1:
        assert (out[1] == 0).all()  # all its picks skipped


def test_slots_read_in_place_with_room_between_them(vector_path):
    generator = torch.Generator().manual_seed(3)
    arenas = random_arenas(6, True, generator)
    slots, weights = random_routing(5, 4, 6, generator)
    hidden = torch.randn(5, 96, generator=generator)
    out = gpt_oss_experts_cpu(hidden, in_strided_slots(arenas), slots, weights, LIMIT, ALPHA)
    assert relative_error(out, gpt_oss_experts_torch(hidden, arenas, slots, weights, LIMIT, ALPHA)) < 2e-6


def test_bfloat16_hidden_comes_back_in_bfloat16():
    generator = torch.Generator().manual_seed(11)
    arenas = random_arenas(6, True, generator)
    slots, weights = random_routing(12, 4, 6, generator)
    hidden = torch.randn(12, 96, generator=generator).to(torch.bfloat16)
    out = gpt_oss_experts_cpu(hidden, arenas, slots, weights.to(torch.bfloat16), LIMIT, ALPHA)
    ref = gpt_oss_experts_torch(hidden.float(), arenas, slots, weights.to(torch.bfloat16).float(), LIMIT, ALPHA)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 1e-2


def test_op_on_the_cpu_is_the_c_kernel_for_mxfp4_and_the_reference_for_dense_experts(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert gpt_oss_experts_op(torch.device("cpu")) is gpt_oss_experts_cpu
    assert gpt_oss_experts_op(torch.device("cpu"), mxfp4=False) is gpt_oss_experts_torch
