"""A remote model: an OpenAI-compatible server (`moechat serve` on a bigger machine, vLLM, SGLang) to
chat through instead of the local engine."""

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFormLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.remote import RemoteModel


class RemotePanel(QWidget):
    """Signals: connect_requested(remote: RemoteModel)."""

    connect_requested = Signal(object)

    def __init__(self, last: dict | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        last = last or {}
        self.base_url = QLineEdit(last.get("base_url", ""))
        self.base_url.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.model = QLineEdit(last.get("model", ""))
        self.model.setPlaceholderText("the model's id on that server")
        self.api_key = QLineEdit(last.get("api_key", ""))
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none")
        self.connect_button = QPushButton("Connect")
        self.connect_button.clicked.connect(self._request)
        form = QFormLayout()
        form.addRow("Server", self.base_url)
        form.addRow("Model", self.model)
        form.addRow("API key", self.api_key)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("<b>Remote model</b> (an OpenAI-compatible server)"))
        layout.addLayout(form)
        layout.addWidget(self.connect_button)

    def remote(self) -> RemoteModel:
        return RemoteModel(self.base_url.text().strip(), self.model.text().strip(), self.api_key.text().strip())

    def _request(self) -> None:
        self.connect_requested.emit(self.remote())
