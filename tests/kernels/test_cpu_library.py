"""Where the CPU kernels were not built, the ops fall back to their torch references and say so once."""

import torch

from app.kernels.cpu import library
from app.kernels.glu_experts import glu_experts_op, glu_experts_torch
from app.kernels.gpt_oss_experts import gpt_oss_experts_op, gpt_oss_experts_torch


def test_without_the_library_the_cpu_runs_the_references_and_one_note_says_why(monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(library, "library", lambda: None)
    library.built.cache_clear()
    try:
        assert gpt_oss_experts_op(torch.device("cpu")) is gpt_oss_experts_torch
        assert glu_experts_op(torch.device("cpu")) is glu_experts_torch
        assert capsys.readouterr().err == library.NOT_BUILT + "\n"
    finally:
        library.built.cache_clear()
