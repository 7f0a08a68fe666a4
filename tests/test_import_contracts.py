"""The boundaries pyproject.toml states as import contracts hold, and import-linter, which checks them,
catches an import that crosses one."""

import shutil
import subprocess
import sys
from pathlib import Path

from importlinter.api import read_configuration

ROOT = Path(__file__).parents[1]
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"], cwd=project,
                          capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert len(contracts) >= 5 and f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout


def test_an_import_across_a_boundary_is_caught(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    theme = tmp_path / "app" / "ui" / "theme.py"
    theme.write_text(theme.read_text() + "\n\ndef _engine():\n    import app.engine.session  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout[-4000:]
    assert "1 broken" in result.stdout and "app.ui.theme -> app.engine.session" in result.stdout
