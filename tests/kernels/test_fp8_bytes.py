"""FP8 weights read as bytes (fp8_bytes.py: GPUs before sm_89), in Triton's interpreter (see conftest.py): the decoding
of every e4m3 byte, and the FP8 products that take it against their references."""

import json

import pytest
import torch
import triton
import triton.language as tl

from app.kernels import fp8_bytes
from app.kernels.expert_tiles import Tiles
from app.kernels.fp8_linear import fp8_linear, fp8_linear_torch
from app.kernels.glu_experts import glu_experts_torch
from tests.kernels import launch_record
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_fp8_linear import FORMATS, PREFILL, random_fp8_linear
from tests.kernels.test_glu_experts_triton import HIDDEN, random_arenas, run_kernel
from tests.kernels.test_gpt_oss_experts import random_routing, relative_error


@triton.jit
def _decode_kernel(bytes_ptr, out_ptr):
    at = tl.arange(0, 256)
    tl.store(out_ptr + at, fp8_bytes.weights_as(tl.load(bytes_ptr + at), out_ptr.dtype.element_ty))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_e4m3_byte_decodes_to_its_value(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=dtype)
    _decode_kernel[(1,)](codes, out)
    expected = codes.view(torch.float8_e4m3fn).to(dtype)
    numbers = ~expected.isnan()  # 0x7F and 0xFF
    assert numbers.sum() == 254
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out[numbers].view(bits), expected[numbers].view(bits))  # signed zeros and subnormals too


def test_only_fp8_weights_go_as_bytes_and_only_where_asked(monkeypatch):
    fp8, bf16 = torch.zeros(4, 16, dtype=torch.float8_e4m3fn), torch.zeros(4, 16, dtype=torch.bfloat16)
    monkeypatch.delenv(fp8_bytes.FORCE, raising=False)
    assert fp8_bytes.for_kernels(fp8) is fp8  # a CPU (the interpreter) takes float8e4nv
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    assert fp8_bytes.for_kernels(fp8).dtype == torch.uint8 and fp8_bytes.for_kernels(bf16) is bf16


def weights_went_as_bytes(launches: set[str]) -> bool:
    return any(launch_record.takes_fp8_bytes(json.loads(launch)) for launch in launches)


def launch_constants(launches: set[str], kernel: str) -> list[dict]:
    """The constexprs of each recorded launch of `kernel`."""
    return [{name: detail for name, kind, detail in launch["arguments"] if kind == "constexpr"}
            for launch in map(json.loads, launches) if launch["kernel"] == kernel]


# one token (rows times a vector), a verify block split over K, a prefill chunk in float16 products
@pytest.mark.parametrize(("tokens", "fmt", "tiles", "dtype"), [
    (1, "per-channel", None, torch.float32),
    (1, "block32", None, torch.bfloat16),
    (16, "block128", (16, Tiles(32, 32), 3), torch.float32),
    (40, "block32", PREFILL, torch.bfloat16),
])
def test_fp8_linear_from_bytes_matches_reference(monkeypatch, tokens, fmt, tiles, dtype):
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    generator = torch.Generator().manual_seed(tokens)
    weight, scale = random_fp8_linear(72, 200, fmt, generator)
    x = torch.randn(tokens, 200, generator=generator).to(dtype)
    with poisoned_allocations(), launch_record.recording_launches() as launches:
        y = fp8_linear(x, weight, scale, FORMATS[fmt], tiles)
    assert weights_went_as_bytes(launches)
    assert relative_error(y, fp8_linear_torch(x.float(), weight, scale, FORMATS[fmt])) < (
        1e-5 if dtype == torch.float32 else 1e-2)


# one token's picks (rows times a vector), a few tokens' tiles, a prefill chunk in float16 products
@pytest.mark.parametrize(("tokens", "fmt", "dtype"), [
    (1, "per-channel", torch.float32), (1, "block32", torch.float32), (5, "per-channel", torch.float32),
    (20, "block128", torch.bfloat16),
])
def test_glu_experts_from_bytes_match_reference(monkeypatch, tokens, fmt, dtype):
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    generator = torch.Generator().manual_seed(tokens + len(fmt))
    arenas = random_arenas(6, fmt, generator)
    slots, weights = random_routing(tokens, 4, 6, generator)
    hidden = torch.randn(tokens, HIDDEN, generator=generator).to(dtype)
    block = FORMATS[fmt]
    with launch_record.recording_launches() as launches:
        out = run_kernel(hidden, arenas, slots, weights.to(dtype), fp8_block=block)
    assert weights_went_as_bytes(launches)
    if tokens == 1:  # one token's gate_up unfolded (glu_experts_one_token.GATE_UP_FROM_BYTES)
        assert [constants["FOLD"] for constants in launch_constants(launches, "_gate_up_kernel")] == [1]
    ref = glu_experts_torch(hidden.float(), arenas, slots, weights.to(dtype).float(), fp8_block=block)
    assert relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 2e-2)
