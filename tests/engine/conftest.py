from pathlib import Path

import pytest

from tests.fixtures.tiny_glm import VARIANTS, write_dequantized_copy, write_tiny_glm


@pytest.fixture(scope="session")
def tiny_glm(tmp_path_factory):
    """variant -> its tiny GLM checkpoint (written once per session: tests must not modify it)."""
    folders: dict[str, Path] = {}

    def folder(variant: str) -> Path:
        if variant not in folders:
            folders[variant] = write_tiny_glm(tmp_path_factory.mktemp(variant), variant)
        return folders[variant]

    return folder


@pytest.fixture(scope="session")
def glm_oracle_folder(tiny_glm, tmp_path_factory):
    """variant -> what transformers loads for it: the checkpoint itself, or for FP8 a float32 copy dequantized
    by the fixture's loop reference (transformers cannot run compressed-tensors without its package, and its
    CPU dequantization of fp8 blocks guesses the block size from the scale grid, wrong for partial blocks)."""
    folders: dict[str, Path] = {}

    def folder(variant: str) -> Path:
        if variant not in folders:
            source = tiny_glm(variant)
            is_fp8 = VARIANTS[variant][2] is not None
            folders[variant] = write_dequantized_copy(source, tmp_path_factory.mktemp(f"{variant}-dequantized")) \
                if is_fp8 else source
        return folders[variant]

    return folder
