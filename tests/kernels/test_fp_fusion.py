"""The kernels keep Triton's FMA fusion whatever Triton's default (app/kernels/__init__.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

READ_SETTING = (
    "import os, app.kernels.norms, triton; "
    "print(os.environ['TRITON_DEFAULT_FP_FUSION'], triton.knobs.language.fp_fusion_enabled(None))"
)


@pytest.mark.parametrize(("setting", "expected"), [(None, "1 True"), ("0", "0 False")], ids=["unset", "the user's"])
def test_fma_fusion_is_on_unless_the_user_turned_it_off(setting, expected):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    if setting is not None:
        env["TRITON_DEFAULT_FP_FUSION"] = setting
    result = subprocess.run([sys.executable, "-c", READ_SETTING], env=env, capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
