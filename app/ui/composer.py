"""The message box: Enter sends, Shift+Enter starts a new line, as in every chat app."""

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit

SEND_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class Composer(QPlainTextEdit):
    """Signals: submitted() on Enter (or Ctrl+Enter) without Shift."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        shift = event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        if event.key() in SEND_KEYS and not shift:
            self.submitted.emit()
            return
        if event.key() in SEND_KEYS:  # Shift+Enter: a plain new line, not Qt's line separator
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)
