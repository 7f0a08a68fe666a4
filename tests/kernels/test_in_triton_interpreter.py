"""Runs this folder's kernel tests in a child pytest with TRITON_INTERPRET=1 (see conftest.py), then compiles
every kernel launch that run made for the H200."""

import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tests.kernels import launch_record
from tests.kernels.conftest import LAUNCHES

FOLDER = Path(__file__).parent


@pytest.fixture(scope="module")
def interpreter_run(tmp_path_factory):
    launches = tmp_path_factory.mktemp("launches") / "launches.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(FOLDER)],
        cwd=FOLDER.parents[1],
        env={**os.environ, "TRITON_INTERPRET": "1", LAUNCHES: str(launches)},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    return result, launches


def test_kernel_tests_pass_in_triton_interpreter(interpreter_run):
    result, _ = interpreter_run
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]  # 5 would mean none collected


@pytest.fixture(scope="module")
def launches(interpreter_run) -> list[dict]:
    _, path = interpreter_run
    assert path.exists(), "the interpreter run recorded no launches (its test above says why)"
    return launch_record.read_launches(path)


def test_every_launch_compiles_for_the_h200(launches, tmp_path, monkeypatch):
    assert {launch["module"] for launch in launches} >= {"app.kernels.gpt_oss_experts_half_pairs",
                                                         "app.kernels.glu_experts_triton"}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # spawned, not forked: the parent's torch has run threads; each imports torch and Triton (~0.4 GB)
    workers = min(os.cpu_count() or 1, 8)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        findings = list(pool.map(launch_record.compile_for_h200, launches))
    failures = [f"{launch['module']}.{launch['kernel']} {launch['options']}: {finding}"
                for launch, finding in zip(launches, findings, strict=True) if finding]
    assert not failures, "\n\n".join(failures)


def test_the_h200_compile_finds_what_the_gpu_would_refuse(launches, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    launch = next(launch for launch in launches
                  if launch["kernel"] == "_fp8_linear_kernel"
                  and ["F32_INPUTS", "constexpr", False] in launch["arguments"])

    def with_constants(**constants):
        return dict(launch, arguments=[[name, kind, constants.get(name, detail)]
                                       for name, kind, detail in launch["arguments"]])

    assert launch_record.compile_for_h200(with_constants()) is None
    assert "shared memory" in launch_record.compile_for_h200(with_constants(BLOCK_M=256, BLOCK_N=256, BLOCK_K=256))
    # a tensor-core dot needs 16 inputs a step at least
    assert launch_record.compile_for_h200(with_constants(BLOCK_K=8)).startswith("CompilationError")
