"""The list of chats: new, open, rename, delete, export to Markdown or JSON."""

import json
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chats import ChatStore


def export_chat(store: ChatStore, chat_id: int, path: Path) -> None:
    """Markdown for a `.md` path (the current branch), JSON otherwise (the whole tree)."""
    if path.suffix.lower() == ".md":
        path.write_text(store.export_markdown(chat_id))
    else:
        path.write_text(json.dumps(store.export_json(chat_id), indent=2, ensure_ascii=False))


class ChatsList(QWidget):
    """Signals: chat_selected(chat_id: int | None), None for a new, still empty chat."""

    chat_selected = Signal(object)

    def __init__(self, store: ChatStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(lambda item: self.chat_selected.emit(item.data(Qt.ItemDataRole.UserRole)))
        new = QPushButton("New chat")
        new.clicked.connect(self.new_chat)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(new)
        layout.addWidget(self.list)
        self.refresh()

    def refresh(self, current: int | None = None) -> None:
        self.list.clear()
        for chat in self.store.chats():
            item = QListWidgetItem(chat.title)
            item.setData(Qt.ItemDataRole.UserRole, chat.id)
            self.list.addItem(item)
            if chat.id == current:
                self.list.setCurrentItem(item)

    def select(self, chat_id: int) -> None:
        self.refresh(chat_id)
        self.chat_selected.emit(chat_id)

    def new_chat(self) -> None:
        self.list.clearSelection()
        self.chat_selected.emit(None)

    def rename(self, chat_id: int, title: str) -> None:
        self.store.rename(chat_id, title)
        self.refresh(chat_id)

    def delete(self, chat_id: int) -> None:
        self.store.delete(chat_id)
        self.refresh()
        self.chat_selected.emit(None)

    def _menu(self, position) -> None:
        item = self.list.itemAt(position)
        if item is None:
            return
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(chat_id, item.text()))
        menu.addAction("Export as Markdown…", lambda: self._ask_export(chat_id, "Markdown (*.md)", ".md"))
        menu.addAction("Export as JSON…", lambda: self._ask_export(chat_id, "JSON (*.json)", ".json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self._ask_delete(chat_id, item.text()))
        menu.exec(self.list.viewport().mapToGlobal(position))

    def _ask_rename(self, chat_id: int, title: str) -> None:
        new_title, accepted = QInputDialog.getText(self, "Rename chat", "Title", text=title)
        if accepted and new_title.strip():
            self.rename(chat_id, new_title.strip())

    def _ask_export(self, chat_id: int, file_filter: str, suffix: str) -> None:
        title = self.store.chat(chat_id).title
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{title}{suffix}", file_filter)
        if path:
            export_chat(self.store, chat_id, Path(path))

    def _ask_delete(self, chat_id: int, title: str) -> None:
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and all its branches?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete(chat_id)
