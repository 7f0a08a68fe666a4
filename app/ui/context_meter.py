"""How much of the model's context the conversation fills, shown under the message box: the engine's
count after the last answer, plus an estimate for the message being written."""

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.chats import Message

CHARS_PER_TOKEN = 4  # a rough count for text the engine has not tokenized yet


def context_used(branch: list[Message], draft: str) -> tuple[int, bool]:
    """Tokens the branch and the draft would fill, and whether that is an estimate: the last answer that
    the engine counted, plus the characters after it at CHARS_PER_TOKEN."""
    counted, after = 0, branch
    for index in range(len(branch) - 1, -1, -1):
        if "context_tokens" in branch[index].stats:
            counted, after = branch[index].stats["context_tokens"], branch[index + 1:]
            break
    chars = sum(len(message.content) for message in after) + len(draft)
    return counted + -(-chars // CHARS_PER_TOKEN), counted == 0 or chars > 0


class ContextMeter(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(6)
        self.label = QLabel()
        self.label.setProperty("role", "figures")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.bar, 1)

    def show_usage(self, used: int, estimated: bool, capacity: int | None) -> None:
        """`capacity` None: a server that does not say its context length."""
        about = "≈ " if estimated else ""
        if capacity:
            self.label.setText(f"Context {about}{used:,} of {capacity:,} tokens ({min(used / capacity, 1):.0%})")
            self.bar.setRange(0, capacity)
            self.bar.setValue(min(used, capacity))
        else:
            self.label.setText(f"Context {about}{used:,} tokens")
        self.bar.setVisible(bool(capacity))
