import subprocess
import sys

from app.ui.main import MainWindow


def test_importing_the_ui_does_not_load_torch():
    code = "import sys, app.ui.main, app.plan, app.model_folder; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_main_window_opens_and_points_to_the_cli(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    assert window.windowTitle() == "MoE Chat"
    assert "moechat generate" in window.centralWidget().text()
