"""Runs this folder's kernel tests in a child pytest with TRITON_INTERPRET=1 (see conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).parent


def test_kernel_tests_pass_in_triton_interpreter():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(FOLDER)],
        cwd=FOLDER.parents[1],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]  # 5 would mean none collected
