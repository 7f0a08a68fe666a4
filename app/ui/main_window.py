"""The main window: chats on the left; a Chat tab (conversation, chat settings, live charts) and a
Models tab (library, downloads, budgets); the engine's state in the status bar; the menu bar.

At start the last model loaded is selected with its plan (else, with nothing else installed, the demo) and,
when the window is asked to (`load_at_start`, the app does) and the setting allows, loaded."""

from dataclasses import asdict, fields
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.chats import ChatStore
from app.paths import DEMO_MODEL
from app.protocol.engine_process import spawn_engine
from app.protocol.events import Error, ModelInfo
from app.protocol.kinds import ErrorKind
from app.protocol.requests import LoadModel
from app.remote import RemoteModel
from app.sizes import format_size
from app.ui.app_settings import AppSettings
from app.ui.budget import BudgetPanel
from app.ui.charts import LiveCharts
from app.ui.chat_defaults import ChatDefaults
from app.ui.chat_panel import ChatPanel
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chats_list import ChatsList
from app.ui.downloads import DownloadPanel
from app.ui.engine_client import EngineClient
from app.ui.hardware import Machine, detect_machine
from app.ui.library import LibraryPanel
from app.ui.menus import MenuBar
from app.ui.remote_panel import RemotePanel
from app.ui.theme import switch as theme_switch

CHAT_TAB, MODELS_TAB = 0, 1
LIVE_SIDE_TAB = 1


class EngineBanner(QWidget):
    """Shown when the engine died or failed to load: the reason, and a button for a new engine."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # the theme's style sheet paints it
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.restart_button = QPushButton("Start a new engine")
        layout = QHBoxLayout(self)
        layout.addWidget(self.reason, 1)
        layout.addWidget(self.restart_button)
        self.hide()

    def show_reason(self, text: str, can_restart: bool) -> None:
        self.reason.setText(text)
        self.restart_button.setVisible(can_restart)
        self.show()


def remembered_request(saved: dict | None) -> LoadModel | None:
    """The load request kept in the settings (JSON keeps a budget per GPU as a list), None when there is
    none; fields that LoadModel does not have (another version wrote them) are left out."""
    known = {field.name for field in fields(LoadModel)}
    if not saved or "path" not in saved:
        return None
    budget = saved.get("gpu_budget")
    kept = {name: value for name, value in saved.items() if name in known}
    return LoadModel(**{**kept, "gpu_budget": tuple(budget) if isinstance(budget, list) else budget})


class MainWindow(QMainWindow):
    def __init__(self, data_dir: Path | None = None, machine: Machine | None = None, spawn=spawn_engine,
                 load_at_start: bool = False):
        super().__init__()
        self.setWindowTitle("MoE Chat")
        data_dir = data_dir or paths.data_dir()
        self._machine = machine
        self._closed = False
        self.store = ChatStore(data_dir / "chats.sqlite")
        self.settings = AppSettings(data_dir / "settings.json")
        self.theme = theme_switch()
        self.theme.choose(self.settings.theme)
        self.client = EngineClient(spawn, self)

        self.chats = ChatsList(self.store)
        self.chat_settings = ChatSettingsPanel()
        self.chat = ChatPanel(self.store, self.client, self.chat_settings, ChatDefaults(self.settings))
        self.charts = LiveCharts()
        self.library = LibraryPanel(self.settings)
        self.downloads = DownloadPanel(self.settings, data_dir / "models")
        self.budget = BudgetPanel(self.machine)
        self.remote_panel = RemotePanel(self.settings.remote)
        self.banner = EngineBanner()
        self.tabs = QTabWidget()
        self.tabs.addTab(self._chat_tab(), "Chat")
        self.tabs.addTab(self._models_tab(), "Models")
        main = QSplitter()
        main.addWidget(self.chats)
        right = QWidget()
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.banner)
        column.addWidget(self.tabs)
        main.addWidget(right)
        main.setSizes([220, 1060])
        self.setCentralWidget(main)
        self._status_bar()
        self.menus = MenuBar(self)
        self._connect()
        recent = self.store.chats()
        self.chat.open_chat(recent[0].id if recent else None)
        self.chats.refresh(self.chat.chat_id)
        self.resize(1280, 800)
        self._load_at_start = load_at_start
        QTimer.singleShot(0, self._start)  # once the window is up: detecting the machine takes a moment

    def machine(self) -> Machine:
        """This machine, detected on first use (nvidia-smi takes a moment)."""
        if self._machine is None:
            self._machine = detect_machine()
        return self._machine

    def _start(self) -> None:
        """Select the last model loaded with its plan, else the demo when nothing else is installed (unless
        a model was chosen meanwhile); load it if the window was asked to and the setting allows."""
        if self._closed or self.library.selected_path() is not None:
            return
        remembered = remembered_request(self.settings.last_load)
        if remembered is not None and self.library.select(remembered.path):
            self.budget.show_plan(remembered)
        elif self.settings.library or not self.library.select(str(DEMO_MODEL)):
            return
        if self._load_at_start and self.settings.load_at_start:
            self.load_selected()

    def _chat_tab(self) -> QWidget:
        side = QTabWidget()
        side.addTab(self.chat_settings, "Settings")
        side.addTab(self.charts, "Live")
        self.side_tabs = side
        splitter = QSplitter()
        splitter.addWidget(self.chat)
        splitter.addWidget(side)
        splitter.setSizes([760, 320])
        return splitter

    def _models_tab(self) -> QWidget:
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.library)
        left.addWidget(self.downloads)
        left.addWidget(self.remote_panel)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(self.budget)
        splitter.setSizes([480, 580])
        return splitter

    def _status_bar(self) -> None:
        self.engine_status = QLabel("No model loaded")
        self._status_before_remote = self.engine_status.text()
        self.load_bar = QProgressBar()
        self.load_bar.setRange(0, 100)
        self.load_bar.setMaximumWidth(200)
        self.load_bar.hide()
        self.cancel_load_button = QPushButton("Cancel loading")
        self.cancel_load_button.hide()
        self.cancel_load_button.clicked.connect(self.client.cancel)
        bar = self.statusBar()
        bar.addWidget(self.engine_status, 1)
        bar.addPermanentWidget(self.load_bar)
        bar.addPermanentWidget(self.cancel_load_button)

    def _connect(self) -> None:
        self.chats.chat_selected.connect(self.chat.open_chat)
        self.chat.chats_changed.connect(lambda: self.chats.show_new(self.chat.chat_id))
        self.library.model_selected.connect(self.budget.show_model)
        self.library.download_requested.connect(self.downloads.look_up)
        self.downloads.model_downloaded.connect(self.library.add_folder)
        self.budget.load_requested.connect(self.load)
        self.remote_panel.connect_requested.connect(self.connect_remote)
        self.banner.restart_button.clicked.connect(self.restart_engine)
        self.theme.changed.connect(self._on_theme)
        client = self.client
        client.load_progress.connect(self._on_load_progress)
        client.loaded.connect(self._on_loaded)
        client.error.connect(self._on_error)
        client.died.connect(self._on_died)
        client.remote_failed.connect(self._on_remote_failed)
        client.step_stats.connect(self.charts.add_step_stats)
        client.tokens.connect(self.charts.add_tokens)

    # the menus' actions

    def escape(self) -> None:
        """Esc: stop the answer or leave the edit; else cancel a load in progress."""
        if not self.chat.escape() and self.load_bar.isVisible():
            self.client.cancel()

    def load_selected(self) -> None:
        if self.budget.plan.placement is not None and self.budget.load_button.isEnabled():
            self.budget.request_load()

    def export(self, suffix: str) -> None:
        if self.chat.chat_id is not None:
            self.chats.ask_export(self.chat.chat_id, suffix)

    def search_chats(self) -> None:
        self.chats.search.setFocus()
        self.chats.search.selectAll()

    def show_tab(self, index: int) -> None:
        self.tabs.setCurrentIndex(index)

    def show_live_charts(self) -> None:
        self.tabs.setCurrentIndex(CHAT_TAB)
        self.side_tabs.setCurrentIndex(LIVE_SIDE_TAB)

    def show_downloads(self) -> None:
        self.tabs.setCurrentIndex(MODELS_TAB)
        self.downloads.repo.setFocus()

    def choose_theme(self, choice: str) -> None:
        self.settings.set_theme(choice)
        self.theme.choose(choice)

    def _on_theme(self, palette) -> None:
        if self._closed:
            return
        self.chat.render()  # the chat's rich text carries colours: written again in the new ones
        self.charts.follow_theme(palette)
        self.budget.bar.update()

    # the engine

    def load(self, request: LoadModel) -> None:
        self.banner.hide()
        self.engine_status.setText(f"Starting the engine for {Path(request.path).name}…")
        self._show_loading(True)
        self.client.load(request)

    def connect_remote(self, remote: RemoteModel) -> None:
        self.banner.hide()
        self._status_before_remote = self.engine_status.text()
        self.engine_status.setText(f"Connecting to {remote.model} at {remote.base_url}…")
        self.client.connect_remote(remote)

    def _on_remote_failed(self, reason: str) -> None:
        self.engine_status.setText(self._status_before_remote)
        kept = " The model loaded before stays loaded." if self.client.info is not None else ""
        self.banner.show_reason(f"The remote model cannot be used: {reason}.{kept}", can_restart=False)

    def restart_engine(self) -> None:
        self.banner.hide()
        self._show_loading(self.client.last_load is not None)
        self.engine_status.setText("Starting a new engine…")
        self.client.restart()

    def _show_loading(self, loading: bool) -> None:
        self.load_bar.setVisible(loading)
        self.cancel_load_button.setVisible(loading)
        self.budget.load_button.setEnabled(not loading and self.budget.plan.placement is not None)
        if loading:
            self.load_bar.setValue(0)

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        self.engine_status.setText(f"Loading {Path(self.client.last_load.path).name}: {stage}")
        self.load_bar.setValue(round(100 * fraction))

    def _on_loaded(self, info: ModelInfo | RemoteModel) -> None:
        self._show_loading(False)
        if isinstance(info, RemoteModel):
            self.settings.remember_remote(asdict(info))
            self.engine_status.setText(f"{info.model} on {info.base_url} (remote) · expert cache and "
                                       "placement: unavailable from a remote server")
            self.tabs.setCurrentIndex(0)
            return
        self.settings.remember_load(asdict(self.client.last_load))
        where = "on the GPU" if self.client.last_load.device == "cuda" else "in memory (CPU)"
        self.engine_status.setText(
            f"{info.name} ({info.model_type}) · {info.expert_slots} of {info.total_experts} experts {where} · "
            f"{format_size(info.device_bytes)} {where} · context {info.context} tokens"
        )
        self.tabs.setCurrentIndex(0)

    def _on_error(self, error: Error) -> None:
        if error.request_id is not None:
            return  # a generation's error: the chat shows it with the answer
        self._show_loading(False)
        if error.kind == ErrorKind.CANCELLED:
            self.engine_status.setText("Loading cancelled")
        else:
            self.engine_status.setText("No model loaded")
            self.banner.show_reason(f"The model did not load: {self.machine().in_words(error.message)}",
                                    can_restart=False)

    def _on_died(self, reason: str) -> None:
        self._show_loading(False)
        self.engine_status.setText("The engine stopped")
        kept = " Your chat and the partial answer are kept." if self.chat.chat_id else ""
        reload = " and load the model again" if self.client.last_load else ""
        self.banner.show_reason(f"<b>{reason[0].upper()}{reason[1:]}.</b>{kept} "
                                f"Start a new engine{reload} to go on.", can_restart=True)

    def shut_down(self) -> None:
        """End the engine process, the downloads' threads and the chart timer; close the chat history.
        Safe to call twice (the close button, then the application's quit)."""
        if self._closed:
            return
        self._closed = True
        self.client.shutdown()
        self.downloads.shut_down()
        self.charts.timer.stop()
        self.store.close()

    def closeEvent(self, event) -> None:
        self.shut_down()
        super().closeEvent(event)
