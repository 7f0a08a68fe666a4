"""A chat's own system prompt and sampling settings."""

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.ui.conversation import DEFAULT_SETTINGS


class ChatSettingsPanel(QWidget):
    """Signals: changed(settings: dict) whenever the user edits a field; reset_requested() and
    save_default_requested() from its buttons (the chat panel knows the model's defaults)."""

    changed = Signal(dict)
    reset_requested = Signal()
    save_default_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("You are a helpful assistant.")
        self.system_prompt.setMaximumHeight(110)
        self.temperature = self._number(QDoubleSpinBox(), 0.0, 2.0, 0.05)
        self.top_p = self._number(QDoubleSpinBox(), 0.05, 1.0, 0.05)  # top-p 0 keeps nothing: the engine refuses it
        self.top_k = self._number(QSpinBox(), 0, 1000, 1)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = self._number(QSpinBox(), 1, 131072, 64)
        self.reasoning_effort = QComboBox()
        self.reasoning_effort.addItems(["low", "medium", "high"])
        self.colour_drafted = QCheckBox("Colour drafted tokens")
        self.colour_drafted.setToolTip("With speculation on, show answer text from accepted drafts in violet "
                                       "(per speculative step).")
        layout = QFormLayout()
        layout.addRow("System prompt", self.system_prompt)
        layout.addRow("Temperature", self.temperature)
        layout.addRow("Top-p", self.top_p)
        layout.addRow("Top-k", self.top_k)
        layout.addRow("Max tokens", self.max_tokens)
        layout.addRow("Reasoning effort", self.reasoning_effort)
        layout.addRow(self.colour_drafted)
        self.reset_button = QPushButton("Reset sampling")
        self.reset_button.setToolTip("Temperature, top-p, top-k, max tokens and reasoning effort back to the "
                                     "loaded model's defaults")
        self.reset_button.clicked.connect(self.reset_requested)
        self.save_default_button = QPushButton("Use for new chats")
        self.save_default_button.setToolTip("New chats with the loaded model start from these settings")
        self.save_default_button.clicked.connect(self.save_default_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.reset_button)
        buttons.addWidget(self.save_default_button)
        buttons.addStretch()
        column = QVBoxLayout(self)
        column.addWidget(QLabel("<b>This chat's settings</b>"))
        column.addLayout(layout)
        column.addLayout(buttons)
        column.addStretch()
        self.show_settings(DEFAULT_SETTINGS)
        self.system_prompt.textChanged.connect(self._emit)
        self.reasoning_effort.currentTextChanged.connect(self._emit)
        self.colour_drafted.toggled.connect(self._emit)
        for box in (self.temperature, self.top_p, self.top_k, self.max_tokens):
            box.valueChanged.connect(self._emit)

    def _number(self, box, low, high, step):
        box.setRange(low, high)
        box.setSingleStep(step)
        return box

    def settings(self) -> dict:
        return {
            "system_prompt": self.system_prompt.toPlainText(),
            "temperature": self.temperature.value(),
            "top_p": self.top_p.value(),
            "top_k": self.top_k.value(),
            "max_tokens": self.max_tokens.value(),
            "reasoning_effort": self.reasoning_effort.currentText(),
            "colour_drafted": self.colour_drafted.isChecked(),
        }

    def show_settings(self, settings: dict) -> None:
        """Show `settings` without reporting them as a change."""
        fields = (self.system_prompt, self.temperature, self.top_p, self.top_k, self.max_tokens, self.reasoning_effort,
                  self.colour_drafted)
        for field in fields:
            field.blockSignals(True)
        self.system_prompt.setPlainText(settings["system_prompt"])
        self.temperature.setValue(settings["temperature"])
        self.top_p.setValue(settings["top_p"])
        self.top_k.setValue(settings["top_k"])
        self.max_tokens.setValue(settings["max_tokens"])
        self.reasoning_effort.setCurrentText(settings["reasoning_effort"])
        self.colour_drafted.setChecked(settings["colour_drafted"])
        for field in fields:
            field.blockSignals(False)

    def _emit(self) -> None:
        self.changed.emit(self.settings())
