"""The desktop app's entry point."""

import sys

from PySide6.QtWidgets import QApplication

from app.ui.exit_signals import ExitOnSignals
from app.ui.main_window import MainWindow


def run_app() -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("MoE Chat")
    exit_on_signals = ExitOnSignals(app)
    window = MainWindow(load_at_start=True)
    app.aboutToQuit.connect(window.shut_down)  # however the app quits, the engine process ends with it
    window.show()
    code = app.exec()
    exit_on_signals.restore()
    window.shut_down()
    return code
