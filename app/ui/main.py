"""The desktop app's entry point."""

import sys

from PySide6.QtWidgets import QApplication

from app.ui.main_window import MainWindow


def run_app() -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("MoE Chat")
    window = MainWindow()
    window.show()
    return app.exec()
