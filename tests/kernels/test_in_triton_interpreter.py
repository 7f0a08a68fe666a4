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
        timeout=1800,  # the suite takes ~1100 s on CI's two cores
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


def compile_each(launches: list[dict], compile_one, tmp_path, monkeypatch) -> list[str]:
    """What `compile_one` finds wrong with each launch, one line per launch it refuses."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # spawned, not forked: the parent's torch has run threads; each imports torch and Triton (~0.4 GB)
    workers = min(os.cpu_count() or 1, 8)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        findings = list(pool.map(compile_one, launches))
    return [f"{launch['module']}.{launch['kernel']} {launch['options']}: {finding}"
            for launch, finding in zip(launches, findings, strict=True) if finding]


def test_every_launch_compiles_for_the_h200(launches, tmp_path, monkeypatch):
    assert {launch["module"] for launch in launches} >= {"app.kernels.gpt_oss_experts_half_pairs",
                                                         "app.kernels.glu_experts_triton"}
    failures = compile_each(launches, launch_record.compile_for_h200, tmp_path, monkeypatch)
    assert not failures, "\n\n".join(failures)


def test_every_launch_a_gpu_before_sm_89_makes_compiles_for_an_rtx_3090(launches, tmp_path, monkeypatch):
    ampere = [launch for launch in launches if launch_record.made_on_ampere(launch)]
    fp8_as_bytes = {launch["kernel"] for launch in ampere if launch_record.takes_fp8_bytes(launch)}
    assert fp8_as_bytes >= {"_fp8_linear_kernel", "_one_token_kernel", "_gate_up_kernel", "_down_kernel"}
    failures = compile_each(ampere, launch_record.compile_for_rtx_3090, tmp_path, monkeypatch)
    assert not failures, "\n\n".join(failures)


def test_the_compiles_find_what_the_gpus_would_refuse(launches, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    launch = next(launch for launch in launches
                  if launch["kernel"] == "_fp8_linear_kernel"
                  and ["F32_INPUTS", "constexpr", False] in launch["arguments"]
                  and ["FP8", "constexpr", False] in launch["arguments"])  # weights converted: as bytes on Ampere

    def with_tiles(stages: int, **constants):
        return dict(launch, options=dict(launch["options"], num_stages=stages),
                    arguments=[[name, kind, constants.get(name, detail)] for name, kind, detail in launch["arguments"]])

    def as_bytes(launch):  # how a GPU before sm_89 takes FP8 weights (Triton has no float8e4nv there)
        return dict(launch, arguments=[[name, "*u8" if kind == "*fp8e4nv" else kind, detail]
                                       for name, kind, detail in launch["arguments"]])

    assert launch_record.compile_for_h200(launch) is None
    # a tensor-core dot needs 16 inputs a step at least
    assert launch_record.compile_for_h200(with_tiles(3, BLOCK_K=8)).startswith("CompilationError")
    assert not launch_record.made_on_ampere(launch) and launch_record.made_on_ampere(as_bytes(launch))
    assert "fp8e4nv" in launch_record.compile_for_rtx_3090(launch)
    assert launch_record.compile_for_rtx_3090(as_bytes(launch)) is None
    # 5 stages of 64 tokens x 128 rows x 128 inputs: 133 KB, more than a desktop card's block has; of 256 inputs, 297
    # KB, more than the H200's
    deep = with_tiles(5, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128)
    assert launch_record.compile_for_h200(deep) is None
    assert "shared memory" in launch_record.compile_for_rtx_3090(as_bytes(deep))
    assert "shared memory" in launch_record.compile_for_h200(with_tiles(5, BLOCK_M=64, BLOCK_N=128, BLOCK_K=256))
    # the H200's compiles are of dependent launches (griddepcontrol), which a GPU before sm_90 refuses
    dependent = next(launch for launch in launches if launch["kernel"] == "_add_rms_norm_kernel")
    assert launch_record.compile_for_h200(dependent) is None
    assert "requires .target sm_90" in launch_record.compile_for_rtx_3090(launch_record.as_on_hopper(dependent))
    assert launch_record.compile_for_rtx_3090(dependent) is None
