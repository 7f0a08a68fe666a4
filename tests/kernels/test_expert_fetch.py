"""The fetch kernel (expert_fetch.py) against its reference, in Triton's interpreter: listed experts' tensors,
of sizes that are not whole 64 KiB nor whole 16 bytes, are copied exactly; nothing else is written."""

import torch

from app.kernels.expert_fetch import fetch_experts, fetch_experts_torch

SIZES = (70_000, 12, 4096, 33)  # bytes of each tensor of an expert


def experts(count: int, generator: torch.Generator) -> list[list[torch.Tensor]]:
    return [[torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator) for size in SIZES]
            for _ in range(count)]


def table(tensors: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.tensor([[t.data_ptr() for t in row] for row in tensors], dtype=torch.long)


def test_listed_experts_are_copied_exactly_and_only_they():
    generator = torch.Generator().manual_seed(0)
    sources, kernel_targets, reference_targets = experts(5, generator), experts(5, generator), experts(5, generator)
    for kernel_row, reference_row in zip(kernel_targets, reference_targets, strict=True):
        for kernel_tensor, reference_tensor in zip(kernel_row, reference_row, strict=True):
            reference_tensor.copy_(kernel_tensor)
    untouched = [[t.clone() for t in row] for row in kernel_targets]
    fetched = torch.tensor([3, 0, -1, -1])
    column_bytes = torch.tensor(SIZES, dtype=torch.long)
    fetch_experts(fetched, table(sources), table(kernel_targets), column_bytes, max(SIZES))
    fetch_experts_torch(fetched, table(sources), table(reference_targets), column_bytes, max(SIZES))
    for expert in range(5):
        for column in range(len(SIZES)):
            got, want = kernel_targets[expert][column], reference_targets[expert][column]
            assert torch.equal(got, want)
            expected = sources[expert][column] if expert in (0, 3) else untouched[expert][column]
            assert torch.equal(got, expected)
