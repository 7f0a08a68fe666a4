"""The model library: the bundled demo model and local model folders (added by path or downloaded), one of
them selected, with a card that says what it is."""

import json
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.errors import UserError
from app.hub import KNOWN_DRAFTERS
from app.model_folder import ModelFolder
from app.paths import DEMO_MODEL
from app.sizes import format_size
from app.ui.app_settings import AppSettings

MANIFEST = ".moechat.json"  # written by app.hub.write_manifest
DEMO_TITLE = "Demo (tiny, answers are not reliable)"
DEMO_CARD = ("<b>The demo model</b> is a 25 MB toy that ships with the app: a 6-layer GPT-OSS mixture of experts "
             "(16 MXFP4 experts) and its DFlash drafter, trained on the Python standard library's documentation. "
             "It shows the app at work (loading, expert offloading, speculation, the live charts) on any "
             "machine; its answers imitate docstrings and are often wrong. Its card: resources/models/README.md.")


def repo_of(folder: str) -> str | None:
    """The hub repository a downloaded folder came from."""
    manifest = Path(folder) / MANIFEST
    return json.loads(manifest.read_text()).get("repo_id") if manifest.is_file() else None


def describe(folder: ModelFolder) -> str:
    size = sum(path.stat().st_size for path in folder.path.glob("*.safetensors"))
    return f"{folder.model_type} · {format_size(size)}"


class LibraryPanel(QWidget):
    """Signals: model_selected(path: str | None); download_requested(repo_id: str) for a drafter."""

    model_selected = Signal(object)
    download_requested = Signal(str)

    def __init__(self, settings: AppSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.list = QListWidget()
        self.list.currentItemChanged.connect(self._on_current)
        self.card = QLabel()
        self.card.setWordWrap(True)
        self.card.setProperty("role", "muted")
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setProperty("role", "error")
        add = QPushButton("Add folder…")
        add.clicked.connect(self.choose_folder)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self._remove_current)
        self.drafter_button = QPushButton()
        self.drafter_button.hide()
        self.drafter_button.clicked.connect(lambda: self.download_requested.emit(self.drafter_button.property("repo")))
        buttons = QHBoxLayout()
        buttons.addWidget(add)
        buttons.addWidget(self.remove_button)
        buttons.addStretch()
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("<b>Models on this machine</b>"))
        layout.addWidget(self.list)
        layout.addWidget(self.card)
        layout.addWidget(self.problem)
        layout.addWidget(self.drafter_button)
        layout.addLayout(buttons)
        if DEMO_MODEL.is_dir():
            self._add_item(str(DEMO_MODEL))
        for path in settings.library:
            self._add_item(path)
        self._on_current(None)

    def paths(self) -> list[str]:
        return [self.list.item(row).data(Qt.ItemDataRole.UserRole) for row in range(self.list.count())]

    def selected_path(self) -> str | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def add_folder(self, path: str) -> bool:
        """Add a model folder (checked first) and select it; False with the reason shown if it is not one."""
        path = str(Path(path).resolve())
        try:
            ModelFolder.open(path)
        except UserError as error:
            self.problem.setText(str(error))
            return False
        self.problem.clear()
        if path not in self.paths():
            self.settings.add_model(path)
            self._add_item(path)
        self.select(path)
        return True

    def select(self, path: str) -> bool:
        """Select the model at `path`; False when the library does not have it."""
        if path not in self.paths():
            return False
        self.list.setCurrentRow(self.paths().index(path))
        return True

    def _add_item(self, path: str) -> None:
        try:
            detail = describe(ModelFolder.open(path))
        except UserError as error:
            detail = f"cannot be used: {error}"
        name = DEMO_TITLE if path == str(DEMO_MODEL) else repo_of(path) or Path(path).name
        item = QListWidgetItem(f"{name}\n{detail}")
        item.setData(Qt.ItemDataRole.UserRole, path)
        item.setToolTip(path)
        self.list.addItem(item)

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Add a model folder (config.json + *.safetensors)")
        if path:
            self.add_folder(path)

    def _remove_current(self) -> None:
        """Take the selected model out of the library (its files stay; the bundled demo stays listed)."""
        path = self.selected_path()
        if path is not None and path != str(DEMO_MODEL):
            self.settings.remove_model(path)
            self.list.takeItem(self.list.currentRow())

    def _on_current(self, item: QListWidgetItem | None) -> None:
        path = item.data(Qt.ItemDataRole.UserRole) if item else None
        self._offer_drafter(path)
        self.card.setText(self._card(path))
        self.card.setVisible(path is not None)
        self.remove_button.setEnabled(path is not None and path != str(DEMO_MODEL))
        self.model_selected.emit(path)

    @staticmethod
    def _card(path: str | None) -> str:
        if path is None:
            return ""
        if path == str(DEMO_MODEL):
            return DEMO_CARD
        repo = repo_of(path)
        return f"{f'From the hub: {repo} · ' if repo else ''}{path}"

    def _offer_drafter(self, path: str | None) -> None:
        """A known target's DFlash drafter, unless the library has it already."""
        drafter = KNOWN_DRAFTERS.get(repo_of(path)) if path else None
        have = {repo_of(folder) for folder in self.settings.library}
        self.drafter_button.setVisible(drafter is not None and drafter not in have)
        if drafter:
            self.drafter_button.setText(f"Get its speculative drafter: {drafter}")
            self.drafter_button.setProperty("repo", drafter)
