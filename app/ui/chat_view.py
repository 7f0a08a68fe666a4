"""The conversation on screen: one widget per message of the current branch."""

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QToolButton, QVBoxLayout, QWidget

from app.answer_figures import stats_line
from app.chats import Message
from app.protocol.kinds import StopReason
from app.ui.message_html import clean, markdown_html

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


class MessageWidget(QFrame):
    """One message: header with sibling navigation and actions, folded reasoning, body, figures.

    Signals: edit_requested(id), regenerate_requested(id), sibling_requested(id of the sibling to show),
    continue_requested(id) for an answer that stopped at its token limit (`can_continue`)."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    sibling_requested = Signal(int)
    continue_requested = Signal(int)

    def __init__(self, message: Message, siblings: list[int], colour_drafted: bool = False,
                 can_continue: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.message_id = message.id
        self.colour_drafted = colour_drafted
        self.role = message.role
        self.code_blocks: list[str] = []
        self.setObjectName("message")
        self.setProperty("role", message.role)  # the theme's style sheet gives each role its bubble
        header = QHBoxLayout()
        header.addWidget(QLabel(f"<b>{ROLE_NAMES.get(message.role, message.role)}</b>"))
        self.position = QLabel()
        if len(siblings) > 1:
            self._add_sibling_navigation(header, siblings)
        header.addStretch()
        if message.role == "user":
            self.edit_button = self._action(header, "Edit", lambda: self.edit_requested.emit(self.message_id))
        else:
            self.continue_button = self._action(header, "Continue",
                                                lambda: self.continue_requested.emit(self.message_id))
            self.continue_button.setToolTip("The answer stopped at its token limit: write on from where it ends")
            self.continue_button.setVisible(can_continue and message.stats.get("stop_reason") == StopReason.LENGTH)
            self.regenerate_button = self._action(header, "Regenerate",
                                                  lambda: self.regenerate_requested.emit(self.message_id))
        self._action(header, "Copy", lambda: QGuiApplication.clipboard().setText(self.text))

        self.reasoning_toggle = QToolButton()
        self.reasoning_toggle.setCheckable(True)
        self.reasoning_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.reasoning_toggle.setAutoRaise(True)
        self.reasoning_toggle.toggled.connect(self._fold)
        self.reasoning = QLabel()
        self.reasoning.setWordWrap(True)
        self.reasoning.setTextFormat(Qt.TextFormat.PlainText)
        self.reasoning.setProperty("role", "reasoning")
        self.reasoning.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body = QLabel()
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.body.linkActivated.connect(self._on_link)
        self.figures = QLabel()
        self.figures.setProperty("role", "figures")

        layout = QVBoxLayout(self)
        layout.addLayout(header)
        for widget in (self.reasoning_toggle, self.reasoning, self.body, self.figures):
            layout.addWidget(widget)
        self.show_text(message.content, message.reasoning, message.stats, message.complete)

    def _add_sibling_navigation(self, header: QHBoxLayout, siblings: list[int]) -> None:
        index = siblings.index(self.message_id)
        self.previous_button = self._action(header, "‹", lambda: self.sibling_requested.emit(siblings[index - 1]))
        self.position.setText(f"{index + 1} / {len(siblings)}")
        header.addWidget(self.position)
        self.next_button = self._action(header, "›", lambda: self.sibling_requested.emit(siblings[index + 1]))
        self.previous_button.setEnabled(index > 0)
        self.next_button.setEnabled(index < len(siblings) - 1)

    @staticmethod
    def _action(header: QHBoxLayout, text: str, handler) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setAutoRaise(True)
        button.clicked.connect(handler)
        header.addWidget(button)
        return button

    def show_text(self, text: str, reasoning: str, stats: dict, complete: bool, streaming: bool = False) -> None:
        self.text = text
        drafted = stats.get("drafted_spans", []) if self.colour_drafted else []
        html, self.code_blocks = markdown_html(text, drafted)
        if streaming and not text:
            html = "<i>thinking…</i>" if reasoning else "<i>waiting for the first token…</i>"
        self.body.setText(html)
        self.reasoning_toggle.setVisible(bool(reasoning))
        words = len(reasoning.split())
        self.reasoning_toggle.setText(f"Reasoning ({words} word{'' if words == 1 else 's'})")
        self.reasoning_toggle.setArrowType(Qt.ArrowType.DownArrow if self.reasoning_toggle.isChecked()
                                           else Qt.ArrowType.RightArrow)
        self.reasoning.setText(clean(reasoning))
        self.reasoning.setVisible(bool(reasoning) and self.reasoning_toggle.isChecked())
        figures = stats_line(stats)
        if not complete and not streaming:
            figures = f"incomplete · {figures}" if figures else "incomplete"
        self.figures.setText(escape(figures))
        self.figures.setVisible(bool(figures))

    def _fold(self, unfolded: bool) -> None:
        self.reasoning.setVisible(unfolded)
        self.reasoning_toggle.setArrowType(Qt.ArrowType.DownArrow if unfolded else Qt.ArrowType.RightArrow)

    def _on_link(self, link: str) -> None:
        if link.startswith("copy:"):
            QGuiApplication.clipboard().setText(self.code_blocks[int(link.removeprefix("copy:"))])


class ChatView(QScrollArea):
    """Signals: edit_requested(id), regenerate_requested(id), sibling_requested(id), continue_requested(id).

    With `colour_drafted`, answer text from accepted drafts (a message's stats["drafted_spans"]) is
    shown in its own colour."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    sibling_requested = Signal(int)
    continue_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        container = QWidget()
        self.column = QVBoxLayout(container)
        self.column.addStretch()
        self.setWidget(container)
        self.widgets: list[MessageWidget] = []
        self.verticalScrollBar().rangeChanged.connect(self._follow)
        self._at_bottom = True
        self.colour_drafted = False

    def show_messages(self, messages: list[Message], siblings: dict[int, list[int]], can_continue: bool = True) -> None:
        """`can_continue`: the last message may offer Continue (not while another answer is written)."""
        for widget in self.widgets:
            self.column.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self.widgets = []
        for message in messages:
            widget = MessageWidget(message, siblings.get(message.id, [message.id]), self.colour_drafted,
                                   can_continue and message is messages[-1])
            widget.edit_requested.connect(self.edit_requested)
            widget.regenerate_requested.connect(self.regenerate_requested)
            widget.sibling_requested.connect(self.sibling_requested)
            widget.continue_requested.connect(self.continue_requested)
            self.column.insertWidget(self.column.count() - 1, widget)
            self.widgets.append(widget)
        self._at_bottom = True

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.message_id == message_id), None)

    def update_streaming(self, message_id: int, text: str, reasoning: str, stats: dict) -> None:
        bar = self.verticalScrollBar()
        self._at_bottom = bar.value() >= bar.maximum() - 4
        widget = self.widget_for(message_id)
        if widget is not None:
            widget.show_text(text, reasoning, stats, complete=False, streaming=True)

    def _follow(self, _minimum: int, maximum: int) -> None:
        if self._at_bottom:
            self.verticalScrollBar().setValue(maximum)
