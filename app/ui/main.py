"""The desktop app's entry point."""

import sys

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

WELCOME = (
    "<h2>MoE Chat</h2>"
    "<p>The chat window, model library and budget sliders are being built.</p>"
    "<p>Today the engine runs from the command line:<br>"
    "<code>moechat generate MODEL_FOLDER --chat --prompt \"Hello\"</code><br>"
    "<code>moechat plan MODEL_FOLDER --gpu-budget 8G --ram-budget 32G</code></p>"
)


class MainWindow(QMainWindow):
    def __init__(self):
        super().__init__()
        self.setWindowTitle("MoE Chat")
        welcome = QLabel(WELCOME)
        welcome.setAlignment(Qt.AlignmentFlag.AlignCenter)
        welcome.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setCentralWidget(welcome)
        self.resize(720, 480)


def run_app() -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    window = MainWindow()
    window.show()
    return app.exec()
