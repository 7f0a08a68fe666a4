"""SIGTERM and SIGINT close the app as its window's close button does, so that the engine process ends
with it. Python runs a signal handler only between bytecodes, and Qt's event loop is C++: the signal's
number is written to a socket (`signal.set_wakeup_fd`) that the event loop watches."""

import signal
import socket

from PySide6.QtCore import QObject, QSocketNotifier
from PySide6.QtWidgets import QApplication

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ExitOnSignals(QObject):
    """While it lives, SIGTERM / SIGINT close every window, then quit the application."""

    def __init__(self, app: QApplication):
        super().__init__(app)
        self._app = app
        self._reader, writer = socket.socketpair()
        self._writer = writer
        for end in (self._reader, writer):
            end.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(writer.fileno())
        self._previous = {number: signal.signal(number, lambda *_: None) for number in SIGNALS}
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._on_signal)

    def _on_signal(self) -> None:
        try:
            self._reader.recv(64)
        except BlockingIOError:
            return
        self._app.closeAllWindows()
        self._app.quit()

    def restore(self) -> None:
        """Give the signals back to their previous handlers."""
        self._notifier.setEnabled(False)
        signal.set_wakeup_fd(self._previous_fd)
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._reader.close()
        self._writer.close()
