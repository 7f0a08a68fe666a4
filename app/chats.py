"""Conversations as message trees in SQLite: an edit starts a branch, a regeneration adds a sibling,
and every write is committed at once, so a crash loses nothing that was shown."""

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.answer_figures import stats_line

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}',
    leaf_id INTEGER
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    complete INTEGER NOT NULL DEFAULT 1,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(chat_id, parent_id);
"""


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    parent_id: int | None
    role: str
    content: str
    reasoning: str = ""
    complete: bool = True
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    updated: float
    settings: dict
    created: float = 0.0


class ChatStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # chats

    def create_chat(self, title: str = "New chat", settings: dict | None = None) -> int:
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO chats (title, created, updated, settings) VALUES (?, ?, ?, ?)",
            (title, now, now, json.dumps(settings or {})),
        )
        return cursor.lastrowid

    def chats(self, containing: str = "") -> list[Chat]:
        """Newest first; `containing`: only the chats whose title or a message has that text (ASCII letters in
        any case)."""
        if not containing:
            rows = self.db.execute("SELECT * FROM chats ORDER BY updated DESC, id DESC")
            return [_chat(r) for r in rows]
        pattern = "%" + containing.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.db.execute(
            "SELECT * FROM chats WHERE title LIKE :p ESCAPE '\\' OR id IN "
            "(SELECT chat_id FROM messages WHERE content LIKE :p ESCAPE '\\') ORDER BY updated DESC, id DESC",
            {"p": pattern},
        )
        return [_chat(r) for r in rows]

    def chat(self, chat_id: int) -> Chat:
        return _chat(self.db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone())

    def rename(self, chat_id: int, title: str) -> None:
        self.db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def set_settings(self, chat_id: int, settings: dict) -> None:
        self.db.execute("UPDATE chats SET settings = ? WHERE id = ?", (json.dumps(settings), chat_id))

    def delete(self, chat_id: int) -> None:
        self.db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # messages

    def add_message(self, chat_id: int, parent_id: int | None, role: str, content: str, *,
                    reasoning: str = "", complete: bool = True, stats: dict | None = None) -> int:
        """Append a message under `parent_id` and make it the chat's current leaf."""
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO messages (chat_id, parent_id, role, content, reasoning, complete, stats, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (chat_id, parent_id, role, content, reasoning, int(complete), json.dumps(stats or {}), now),
        )
        self.db.execute("UPDATE chats SET leaf_id = ?, updated = ? WHERE id = ?", (cursor.lastrowid, now, chat_id))
        return cursor.lastrowid

    def update_message(self, message_id: int, content: str, *, reasoning: str = "", complete: bool = True,
                       stats: dict | None = None) -> None:
        """Store the text streamed so far (a partial answer survives a crash as `complete=False`)."""
        self.db.execute(
            "UPDATE messages SET content = ?, reasoning = ?, complete = ?, stats = ? WHERE id = ?",
            (content, reasoning, int(complete), json.dumps(stats or {}), message_id),
        )

    def message(self, message_id: int) -> Message:
        return _message(self.db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone())

    def edit(self, message_id: int, content: str) -> int:
        """A new version of a message beside the old one: the old branch stays."""
        old = self.message(message_id)
        return self.add_message(old.chat_id, old.parent_id, old.role, content)

    def siblings(self, message_id: int) -> list[Message]:
        """Every version of this message (itself included), oldest first."""
        old = self.message(message_id)
        rows = self.db.execute(
            "SELECT * FROM messages WHERE chat_id = ? AND parent_id IS ? ORDER BY id", (old.chat_id, old.parent_id)
        )
        return [_message(r) for r in rows]

    def select(self, message_id: int) -> None:
        """Show the branch through `message_id`: its newest descendant becomes the current leaf."""
        leaf = message_id
        while row := self.db.execute(
            "SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1", (leaf,)
        ).fetchone():
            leaf = row["id"]
        self.db.execute("UPDATE chats SET leaf_id = ? WHERE id = ?", (leaf, self.message(message_id).chat_id))

    def branch(self, chat_id: int) -> list[Message]:
        """The current branch, root first."""
        row = self.db.execute("SELECT leaf_id FROM chats WHERE id = ?", (chat_id,)).fetchone()
        return self.path_to(row["leaf_id"] if row else None)

    def path_to(self, message_id: int | None) -> list[Message]:
        """The messages from the root down to `message_id`."""
        path = []
        while message_id is not None:
            message = self.message(message_id)
            path.append(message)
            message_id = message.parent_id
        return path[::-1]

    def all_messages(self, chat_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [_message(r) for r in rows]

    # export

    def export_markdown(self, chat_id: int) -> str:
        """The current branch, with the models that answered, the chat's date and each answer's figures."""
        chat, branch = self.chat(chat_id), self.branch(chat_id)
        models = list(dict.fromkeys(m.stats["model"] for m in branch if m.stats.get("model")))
        lines = [f"# {chat.title}", ""]
        if models:
            lines.append(f"- Model: {', '.join(models)}")
        lines += [f"- Date: {time.strftime('%Y-%m-%d %H:%M', time.localtime(chat.created))}",
                  "- Exported from MoE Chat", ""]
        for message in branch:
            lines += [f"## {message.role.capitalize()}", ""]
            if message.reasoning:
                lines += ["<details><summary>Reasoning</summary>", "", message.reasoning, "", "</details>", ""]
            lines += [message.content, ""]
            figures = stats_line(message.stats)
            if figures:
                lines += [f"*{figures}*", ""]
        return "\n".join(lines)

    def export_json(self, chat_id: int) -> dict:
        """The whole tree, every branch, with the current branch's leaf."""
        chat = self.chat(chat_id)
        branch = self.branch(chat_id)
        return {
            "title": chat.title,
            "settings": chat.settings,
            "current_leaf": branch[-1].id if branch else None,
            "messages": [message.__dict__ for message in self.all_messages(chat_id)],
        }


def _chat(row: sqlite3.Row) -> Chat:
    return Chat(row["id"], row["title"], row["updated"], json.loads(row["settings"]), row["created"])


def _message(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["chat_id"], row["parent_id"], row["role"], row["content"], row["reasoning"],
                   bool(row["complete"]), json.loads(row["stats"]))
