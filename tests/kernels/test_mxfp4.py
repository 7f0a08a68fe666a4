"""MXFP4 decoding against a bit-level reading of the e2m1 format and the E8M0 scale."""

import torch

from app.kernels.formats.mxfp4 import E2M1_VALUES, decode_mxfp4, encode_mxfp4


def e2m1_by_bits(code: int) -> float:
    """Sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 0b1
    magnitude = mantissa * 0.5 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2)
    return sign * magnitude


def test_every_code_in_both_nibbles_with_many_scales():
    generator = torch.Generator().manual_seed(0)
    every_byte = torch.arange(256, dtype=torch.uint8)
    blocks = torch.cat([every_byte, torch.randint(0, 256, (256,), generator=generator, dtype=torch.uint8)])
    blocks = blocks.reshape(32, 16)  # 32 groups of 16 bytes
    scales = torch.tensor([0, 1, 100, 120, 126, 127, 128, 140, 200, 250] * 3 + [127, 64], dtype=torch.uint8)
    decoded = decode_mxfp4(blocks, scales, torch.float64)
    assert decoded.shape == (32 * 32,)
    expected = []
    for group in range(32):
        scale = 2.0 ** (int(scales[group]) - 127)
        for byte in blocks[group].tolist():
            expected += [e2m1_by_bits(byte & 0x0F) * scale, e2m1_by_bits(byte >> 4) * scale]
    assert torch.equal(decoded, torch.tensor(expected, dtype=torch.float64))


def test_leading_dimensions_are_kept():
    blocks = torch.randint(0, 256, (3, 5, 2, 16), dtype=torch.uint8)
    scales = torch.randint(120, 130, (3, 5, 2), dtype=torch.uint8)
    decoded = decode_mxfp4(blocks, scales, torch.float32)
    assert decoded.shape == (3, 5, 64)
    assert torch.equal(decoded[1, 2], decode_mxfp4(blocks[1, 2], scales[1, 2], torch.float32))


def test_encoding_decoded_values_gives_them_back_exactly():
    blocks = torch.randint(0, 256, (4, 6, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    blocks[..., 0] |= 0x07  # every group holds a magnitude 6, so its scale is the one encoding picks
    scales = torch.randint(100, 140, (4, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    values = decode_mxfp4(blocks, scales, torch.float32)
    again = decode_mxfp4(*encode_mxfp4(values), torch.float32)
    assert torch.equal(again, values)


def test_encoding_rounds_each_value_to_the_nearest_code_of_a_scale_that_does_not_clip():
    values = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02
    blocks, scales = encode_mxfp4(values)
    assert blocks.shape == (8, 2, 16) and scales.shape == (8, 2)
    decoded = decode_mxfp4(blocks, scales, torch.float32)
    grid = torch.tensor(E2M1_VALUES)
    for row in range(8):
        for group in range(2):
            scale = 2.0 ** (int(scales[row, group]) - 127)
            chunk = values[row, group * 32:(group + 1) * 32]
            assert chunk.abs().max() <= 6 * scale < 2 * chunk.abs().max()  # the smallest scale that fits
            nearest = (chunk[:, None] - grid * scale).abs().min(dim=1).values
            assert torch.allclose((decoded[row, group * 32:(group + 1) * 32] - chunk).abs(), nearest)
