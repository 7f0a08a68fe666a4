"""The chat: the conversation view, the composer, and the glue to the engine and the chat store."""

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.chats import ChatStore, Message
from app.protocol.events import Done, Error, ModelInfo
from app.protocol.kinds import StopReason
from app.protocol.requests import Generate
from app.ui.chat_defaults import SAMPLING, ChatDefaults
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chat_view import ChatView
from app.ui.composer import Composer
from app.ui.context_meter import ContextMeter, context_used
from app.ui.conversation import Answer, chat_settings, engine_messages, title_for
from app.ui.engine_client import EngineClient

READY_HINT = "Message (Enter sends, Shift+Enter starts a new line)"
NO_MODEL_HINT = "Load a model in the Models tab to start."


class ChatPanel(QWidget):
    """Signals: chats_changed() when a chat was created."""

    chats_changed = Signal()

    def __init__(self, store: ChatStore, client: EngineClient, settings: ChatSettingsPanel, defaults: ChatDefaults,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.store, self.client, self.settings, self.defaults = store, client, settings, defaults
        self.chat_id: int | None = None
        self.answer: Answer | None = None
        self.editing_id: int | None = None
        self.branch: list[Message] = []  # the messages on screen, as stored when last rendered
        self.view = ChatView()
        self.view.edit_requested.connect(self.start_edit)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.sibling_requested.connect(self.select_sibling)
        self.view.continue_requested.connect(self.continue_answer)
        self.editing_note = QLabel()
        self.editing_note.setProperty("role", "muted")
        self.editing_note.hide()
        self.composer = Composer()
        self.composer.setMaximumHeight(110)
        self.composer.submitted.connect(self.send)
        self.composer.textChanged.connect(self.show_context)
        self.meter = ContextMeter()
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer (Esc)")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.hide()
        self.settings.changed.connect(self._store_settings)
        self.settings.reset_requested.connect(self.reset_sampling)
        self.settings.save_default_requested.connect(self.save_as_model_default)

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
        layout.addWidget(self.meter)

        client.tokens.connect(self.on_tokens)
        client.finished.connect(self.on_finished)
        client.error.connect(self.on_error)
        client.died.connect(self.on_died)
        client.loaded.connect(self._on_loaded)
        self._update_buttons()

    # the chat on screen

    def open_chat(self, chat_id: int | None) -> None:
        """Show a stored chat, or None: a new chat, with the loaded model's default settings."""
        self.chat_id = chat_id
        self.cancel_edit()
        self.settings.show_settings(chat_settings(self.store, chat_id) if chat_id
                                    else self.defaults.for_model(self.client.info))
        self.render()

    def render(self) -> None:
        messages = self.branch = self.store.branch(self.chat_id) if self.chat_id else []
        self.view.colour_drafted = self.settings.settings()["colour_drafted"]
        self.view.show_messages(messages, {m.id: [s.id for s in self.store.siblings(m.id)] for m in messages},
                                can_continue=self.answer is None)
        if self.answer is not None and self.answer.chat_id == self.chat_id:
            self._show_answer()
        self.show_context()

    def show_context(self) -> None:
        used, estimated = context_used(self.branch, self.composer.toPlainText())
        info = self.client.info
        self.meter.show_usage(used, estimated, info.context if isinstance(info, ModelInfo) else None)
        self.meter.setVisible(self.client.info is not None)

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

    def regenerate_last(self) -> None:
        if self.branch and self.branch[-1].role == "assistant":
            self.regenerate(self.branch[-1].id)

    def continue_last(self) -> None:
        last = self.branch[-1] if self.branch else None
        if last is not None and last.role == "assistant" and last.stats.get("stop_reason") == StopReason.LENGTH:
            self.continue_answer(last.id)

    def continue_answer(self, message_id: int) -> None:
        """Go on with an answer that stopped at its token limit: the conversation up to it, the answer
        included, is the prompt, and what comes is added to the same message."""
        if self._can_ask():
            self._ask(message_id, continues=self.store.message(message_id))

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

    def escape(self) -> bool:
        """Esc: stop the answer being written, else leave the edit; False when there was neither."""
        if self.answer is not None:
            self.stop()
            return True
        if self.editing_id is not None:
            self.cancel_edit()
            return True
        return False

    def reset_sampling(self) -> None:
        """The sampling settings back to the loaded model's defaults (the system prompt stays)."""
        defaults = self.defaults.for_model(self.client.info)
        self.settings.show_settings({**self.settings.settings(), **{key: defaults[key] for key in SAMPLING}})
        self._store_settings(self.settings.settings())

    def save_as_model_default(self) -> None:
        """This chat's settings become the loaded model's: every new chat with it starts from them."""
        if self.client.info is not None:
            self.defaults.save(self.client.info, self.settings.settings())

    def _can_ask(self) -> bool:
        return self.answer is None and self.client.info is not None

    def _ask(self, last_id: int, continues: Message | None = None) -> None:
        """Ask for the answer to the conversation up to `last_id` (or the rest of `continues`, its message)."""
        settings = chat_settings(self.store, self.chat_id)
        info = self.client.info
        is_gpt_oss = isinstance(info, ModelInfo) and info.model_type == "gpt_oss"
        request = Generate(
            0, max_new_tokens=settings["max_tokens"],
            messages=engine_messages(self.store, last_id, settings["system_prompt"]),
            reasoning_effort=settings["reasoning_effort"] if is_gpt_oss else None,
            temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"],
        )
        request_id = self.client.generate(request)
        question_id = continues.parent_id if continues else last_id
        self.answer = Answer(self.store, self.chat_id, question_id, request_id, info.name,
                             continues=continues)
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

    def _on_loaded(self, _info) -> None:
        if self.chat_id is None:  # a new chat starts from the model's defaults
            self.settings.show_settings(self.defaults.for_model(self.client.info))
        self._update_buttons()

    def _show_answer(self) -> None:
        answer = self.answer
        tokens = answer.tokens or (None if self.client.remote else 0)  # a remote may not say its token ids
        if tokens is not None:
            tokens += answer.earlier_tokens
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
        self.composer.setPlaceholderText(READY_HINT if ready else NO_MODEL_HINT)
        self.show_context()

    def _store_settings(self, settings: dict) -> None:
        if self.chat_id is not None:
            self.store.set_settings(self.chat_id, settings)
        if settings["colour_drafted"] != self.view.colour_drafted:
            self.render()
