import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from tests.fixtures.tiny_dflash import write_tiny_dflash
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tests.fixtures.tiny_tokenizer import write_harmony_tokenizer


@pytest.fixture(scope="session")
def tiny_gpt_oss(tmp_path_factory):
    """A tiny MXFP4 GPT-OSS checkpoint with a harmony tokenizer (session-wide: tests must not modify it)."""
    folder = write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))
    write_harmony_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_gpt_oss_dense(tmp_path_factory):
    """The same architecture with experts already dequantized (gate_up_proj / down_proj, bf16)."""
    return write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss-dense"), mxfp4=False, seed=1)


@pytest.fixture(scope="session")
def tiny_dflash(tiny_gpt_oss, tmp_path_factory):
    """A tiny DFlash drafter for the tiny GPT-OSS target (block size 6, target layers 0 and 2)."""
    target_config = json.loads((tiny_gpt_oss / "config.json").read_text())
    return write_tiny_dflash(tmp_path_factory.mktemp("tiny-dflash"), target_config)
