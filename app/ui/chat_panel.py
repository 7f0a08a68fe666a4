"""The chat: the conversation view, the composer, and the glue to the engine and the chat store."""

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.chats import ChatStore
from app.engine.protocol import Done, Error, Generate
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chat_view import ChatView
from app.ui.conversation import Answer, chat_settings, engine_messages, title_for
from app.ui.engine_client import EngineClient


class ChatPanel(QWidget):
    """Signals: chats_changed() when a chat was created."""

    chats_changed = Signal()

    def __init__(self, store: ChatStore, client: EngineClient, settings: ChatSettingsPanel,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.store, self.client, self.settings = store, client, settings
        self.chat_id: int | None = None
        self.answer: Answer | None = None
        self.editing_id: int | None = None
        self.view = ChatView()
        self.view.edit_requested.connect(self.start_edit)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.sibling_requested.connect(self.select_sibling)
        self.editing_note = QLabel()
        self.editing_note.setStyleSheet("color: #6b7280")
        self.editing_note.hide()
        self.composer = QPlainTextEdit()
        self.composer.setPlaceholderText("Load a model in the Models tab to start.")
        self.composer.setMaximumHeight(110)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.hide()
        QShortcut(QKeySequence("Ctrl+Return"), self.composer, activated=self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self.composer, activated=self.cancel_edit)
        self.settings.changed.connect(self._store_settings)

        row = QHBoxLayout()
        row.addWidget(self.composer)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch()
        row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.editing_note)
        layout.addLayout(row)

        client.tokens.connect(self.on_tokens)
        client.finished.connect(self.on_finished)
        client.error.connect(self.on_error)
        client.died.connect(self.on_died)
        client.loaded.connect(lambda _info: self._update_buttons())
        self._update_buttons()

    # the chat on screen

    def open_chat(self, chat_id: int | None) -> None:
        self.chat_id = chat_id
        self.cancel_edit()
        self.settings.show_settings(chat_settings(self.store, chat_id) if chat_id else self.settings.settings())
        self.render()

    def render(self) -> None:
        messages = self.store.branch(self.chat_id) if self.chat_id else []
        self.view.colour_drafted = self.settings.settings()["colour_drafted"]
        self.view.show_messages(messages, {m.id: [s.id for s in self.store.siblings(m.id)] for m in messages})
        if self.answer is not None and self.answer.chat_id == self.chat_id:
            self._show_answer()

    def select_sibling(self, message_id: int) -> None:
        self.store.select(message_id)
        self.render()

    # asking

    def send(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or not self._can_ask():
            return
        if self.editing_id is not None:
            user_id = self.store.edit(self.editing_id, text)
            self.cancel_edit()
        else:
            if self.chat_id is None:
                self.chat_id = self.store.create_chat(title_for(text), self.settings.settings())
                self.chats_changed.emit()
            branch = self.store.branch(self.chat_id)
            user_id = self.store.add_message(self.chat_id, branch[-1].id if branch else None, "user", text)
        self.composer.clear()
        self._ask(user_id)

    def regenerate(self, message_id: int) -> None:
        """Another answer beside `message_id` (an assistant message), from the same question."""
        if self._can_ask():
            self._ask(self.store.message(message_id).parent_id)

    def start_edit(self, message_id: int) -> None:
        """Put a user message in the composer; sending it makes a new branch, the old one stays."""
        self.editing_id = message_id
        self.composer.setPlainText(self.store.message(message_id).content)
        self.editing_note.setText("Editing a message: Send makes a new version beside it (Esc cancels).")
        self.editing_note.show()
        self.composer.setFocus()

    def cancel_edit(self) -> None:
        if self.editing_id is not None:
            self.composer.clear()
        self.editing_id = None
        self.editing_note.hide()

    def stop(self) -> None:
        if self.answer is not None:
            self.client.cancel()

    def _can_ask(self) -> bool:
        return self.answer is None and self.client.info is not None

    def _ask(self, question_id: int) -> None:
        settings = chat_settings(self.store, self.chat_id)
        is_gpt_oss = self.client.info.get("model_type") == "gpt_oss"
        request = Generate(
            0, max_new_tokens=settings["max_tokens"],
            messages=engine_messages(self.store, question_id, settings["system_prompt"]),
            reasoning_effort=settings["reasoning_effort"] if is_gpt_oss else None,
            temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"],
        )
        request_id = self.client.generate(request)
        self.answer = Answer(self.store, self.chat_id, question_id, request_id)
        self.render()
        self._update_buttons()

    # the engine's side

    def on_tokens(self, events: list) -> None:
        if self.answer is None:
            return
        mine = [e for e in events if e.request_id == self.answer.request_id]
        if mine:
            self.answer.add(mine)
            if self.answer.chat_id == self.chat_id:
                self._show_answer()

    def on_finished(self, done: Done) -> None:
        if self.answer is not None and done.request_id == self.answer.request_id:
            self.answer.finish(done)
            self._end_answer()

    def on_error(self, error: Error) -> None:
        if self.answer is not None and error.request_id == self.answer.request_id:
            self.answer.interrupt(error.message)
            self._end_answer()

    def on_died(self, reason: str) -> None:
        if self.answer is not None:
            self.answer.interrupt(reason)
            self._end_answer()
        self._update_buttons()

    def _show_answer(self) -> None:
        answer = self.answer
        tokens = answer.tokens or (None if self.client.remote else 0)  # a remote may not say its token ids
        self.view.update_streaming(answer.message_id, answer.text, answer.reasoning,
                                   {"tokens": tokens, "drafted_spans": answer.drafted_spans})

    def _end_answer(self) -> None:
        self.answer = None
        self.render()
        self._update_buttons()

    def _update_buttons(self) -> None:
        streaming = self.answer is not None
        ready = self.client.info is not None
        self.send_button.setVisible(not streaming)
        self.stop_button.setVisible(streaming)
        self.send_button.setEnabled(ready)
        self.composer.setPlaceholderText("Message (Ctrl+Enter sends)" if ready
                                         else "Load a model in the Models tab to start.")

    def _store_settings(self, settings: dict) -> None:
        if self.chat_id is not None:
            self.store.set_settings(self.chat_id, settings)
        if settings["colour_drafted"] != self.view.colour_drafted:
            self.render()
