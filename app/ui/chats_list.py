"""The list of chats: new, open, search, rename, delete, export to Markdown or JSON."""

import json
from pathlib import Path

from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chats import ChatStore

EXPORTS = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}
UNSAFE_IN_NAMES = str.maketrans({character: "_" for character in '/\\:*?"<>|'})


def export_chat(store: ChatStore, chat_id: int, path: Path) -> None:
    """Markdown for a `.md` path (the current branch), JSON otherwise (the whole tree)."""
    if path.suffix.lower() == ".md":
        path.write_text(store.export_markdown(chat_id))
    else:
        path.write_text(json.dumps(store.export_json(chat_id), indent=2, ensure_ascii=False))


def documents_folder() -> Path:
    """Where exports are offered first: the user's documents folder (their home where there is none)."""
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return Path(documents) if documents and Path(documents).is_dir() else Path.home()


def export_path(title: str, suffix: str) -> Path:
    """The file an export of the chat `title` is first offered as."""
    return documents_folder() / f"{title.translate(UNSAFE_IN_NAMES).strip() or 'chat'}.{suffix}"


class ChatsList(QWidget):
    """Signals: chat_selected(chat_id: int | None), None for a new, still empty chat."""

    chat_selected = Signal(object)

    def __init__(self, store: ChatStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _text: self.refresh(self.current_chat()))
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(lambda item: self.chat_selected.emit(item.data(Qt.ItemDataRole.UserRole)))
        new = QPushButton("New chat")
        new.clicked.connect(self.new_chat)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(new)
        layout.addWidget(self.search)
        layout.addWidget(self.list)
        self.refresh()

    def current_chat(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def refresh(self, current: int | None = None) -> None:
        """The chats that match the search box, newest first, `current` selected."""
        self.list.clear()
        for chat in self.store.chats(self.search.text().strip()):
            item = QListWidgetItem(chat.title)
            item.setData(Qt.ItemDataRole.UserRole, chat.id)
            self.list.addItem(item)
            if chat.id == current:
                self.list.setCurrentItem(item)

    def show_new(self, chat_id: int) -> None:
        """List a chat just created, selected (a search that would hide it is cleared)."""
        self.search.blockSignals(True)
        self.search.clear()
        self.search.blockSignals(False)
        self.refresh(chat_id)

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
        menu.addAction("Export as Markdown…", lambda: self.ask_export(chat_id, "md"))
        menu.addAction("Export as JSON…", lambda: self.ask_export(chat_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self._ask_delete(chat_id, item.text()))
        menu.exec(self.list.viewport().mapToGlobal(position))

    def _ask_rename(self, chat_id: int, title: str) -> None:
        new_title, accepted = QInputDialog.getText(self, "Rename chat", "Title", text=title)
        if accepted and new_title.strip():
            self.rename(chat_id, new_title.strip())

    def ask_export(self, chat_id: int, suffix: str) -> None:
        """Ask where to export the chat (first offered in the documents folder), then write it."""
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(export_path(self.store.chat(chat_id).title,
                                                                                     suffix)), EXPORTS[suffix])
        if path:
            export_chat(self.store, chat_id, Path(path))

    def _ask_delete(self, chat_id: int, title: str) -> None:
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and all its branches?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete(chat_id)
