import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from tests.fixtures.run_end import interrupt_on_termination
from tests.fixtures.tiny_dflash import write_tiny_dflash
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tests.fixtures.tiny_tokenizer import write_harmony_tokenizer


def pytest_configure(config):
    interrupt_on_termination()


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


@pytest.fixture
def threads_loaded(monkeypatch) -> list[int]:
    """The `cpu_threads` of every model the session module loads from now on (it loads them all), in order."""
    from app.engine import session

    loaded, load_model = [], session.load_model

    def recording_load(*args, **options):
        loaded.append(options.get("cpu_threads", 0))
        return load_model(*args, **options)

    monkeypatch.setattr(session, "load_model", recording_load)
    return loaded


@pytest.fixture(scope="session")
def served_tiny_gpt_oss(tiny_gpt_oss):
    """`moechat serve` on the tiny GPT-OSS (float32 CPU, experts offloaded to 6 slots, 4 requests decoding
    together and 4 waiting at most, 24 tokens for a chat that gives no max_tokens), as a subprocess for the
    whole session; its key comes from $MOECHAT_API_KEY."""
    from tests.fixtures.openai_server import moechat_serve
    from tests.test_cli_spec import budget_for_slots

    context = 1024
    with moechat_serve(tiny_gpt_oss, "--context", str(context), "--max-batch", "4", "--max-queue", "4",
                       "--default-max-tokens", "24",
                       "--gpu-budget", str(budget_for_slots(tiny_gpt_oss, 6, context))) as server:
        yield server
