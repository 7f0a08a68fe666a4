"""The menu bar: every action of the window with its shortcut, as desktop chat apps lay them out
(File, Chat, Model, View, Help)."""

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QMessageBox

from app.ui.library import DEMO_CARD

SHORTCUTS = (
    ("Enter", "send the message"),
    ("Shift+Enter", "a new line in the message"),
    ("Esc", "stop the answer, or leave the edit of a message, or cancel loading"),
    ("Ctrl+N", "new chat"),
    ("Ctrl+F", "search the chats"),
    ("Ctrl+R", "regenerate the last answer"),
    ("Ctrl+L", "load the selected model with the plan on screen"),
    ("Ctrl+O", "add a model folder"),
    ("Ctrl+1 / 2 / 3", "the chat, the models, the live charts"),
    ("Ctrl+Q", "quit"),
)
THEMES = (("Follow the system", "system"), ("Light", "light"), ("Dark", "dark"))


def add_action(menu: QMenu, text: str, slot, shortcut: str | None = None) -> QAction:
    action = menu.addAction(text)
    action.triggered.connect(lambda _checked=False: slot())
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    return action


class MenuBar:
    """Builds the window's menus; `actions` names each action for the tests and the screenshots."""

    def __init__(self, window: QMainWindow):
        self.window = window
        self.actions: dict[str, QAction] = {}
        bar = window.menuBar()
        self._file(bar.addMenu("&File"))
        self._chat(bar.addMenu("&Chat"))
        self._model(bar.addMenu("&Model"))
        self._view(bar.addMenu("&View"))
        self._help(bar.addMenu("&Help"))

    def _file(self, menu: QMenu) -> None:
        w = self.window
        self.actions["new chat"] = add_action(menu, "New chat", w.chats.new_chat, "Ctrl+N")
        menu.addSeparator()
        self.actions["export markdown"] = add_action(menu, "Export this chat as Markdown…", lambda: w.export("md"))
        self.actions["export json"] = add_action(menu, "Export this chat as JSON…", lambda: w.export("json"))
        menu.addSeparator()
        self.actions["quit"] = add_action(menu, "Quit", w.close, "Ctrl+Q")

    def _chat(self, menu: QMenu) -> None:
        w = self.window
        self.actions["stop"] = add_action(menu, "Stop the answer / leave the edit", w.escape, "Esc")
        self.actions["regenerate"] = add_action(menu, "Regenerate the last answer", w.chat.regenerate_last, "Ctrl+R")
        self.actions["continue"] = add_action(menu, "Continue the last answer", w.chat.continue_last)
        self.actions["search"] = add_action(menu, "Search the chats", w.search_chats, "Ctrl+F")
        menu.addSeparator()
        self.actions["reset sampling"] = add_action(menu, "Reset sampling to the model's defaults",
                                                    w.chat.reset_sampling)
        self.actions["save default"] = add_action(menu, "Use this chat's settings for new chats with this model",
                                                  w.chat.save_as_model_default)

    def _model(self, menu: QMenu) -> None:
        w = self.window
        self.actions["load"] = add_action(menu, "Load the selected model", w.load_selected, "Ctrl+L")
        self.actions["cancel load"] = add_action(menu, "Cancel loading", w.client.cancel)
        self.actions["new engine"] = add_action(menu, "Start a new engine", w.restart_engine)
        menu.addSeparator()
        self.actions["add folder"] = add_action(menu, "Add a model folder…", w.library.choose_folder, "Ctrl+O")
        self.actions["download"] = add_action(menu, "Download from the hub…", w.show_downloads)
        menu.addSeparator()
        at_start = menu.addAction("Load the last model at start")
        at_start.setCheckable(True)
        at_start.setChecked(w.settings.load_at_start)
        at_start.toggled.connect(w.settings.set_load_at_start)
        self.actions["load at start"] = at_start

    def _view(self, menu: QMenu) -> None:
        w = self.window
        themes = menu.addMenu("Theme")
        group = QActionGroup(themes)
        for text, choice in THEMES:
            action = add_action(themes, text, lambda choice=choice: w.choose_theme(choice))
            action.setCheckable(True)
            action.setChecked(choice == w.settings.theme)
            group.addAction(action)
            self.actions[f"theme {choice}"] = action
        menu.addSeparator()
        self.actions["show chat"] = add_action(menu, "Chat", lambda: w.show_tab(0), "Ctrl+1")
        self.actions["show models"] = add_action(menu, "Models and budgets", lambda: w.show_tab(1), "Ctrl+2")
        self.actions["show live"] = add_action(menu, "Live charts", w.show_live_charts, "Ctrl+3")

    def _help(self, menu: QMenu) -> None:
        w = self.window
        shortcuts = "".join(f"<tr><td><b>{keys}</b></td><td>{what}</td></tr>" for keys, what in SHORTCUTS)
        self.actions["shortcuts"] = add_action(menu, "Keyboard shortcuts", lambda: QMessageBox.information(
            w, "Keyboard shortcuts", f"<table cellpadding='3'>{shortcuts}</table>"))
        self.actions["about demo"] = add_action(menu, "About the demo model",
                                                lambda: QMessageBox.information(w, "The demo model", DEMO_CARD))
        self.actions["about"] = add_action(menu, "About MoE Chat", lambda: QMessageBox.about(
            w, "About MoE Chat", "<b>MoE Chat</b> chats with large Mixture-of-Experts models (GPT-OSS, GLM) on "
            "one machine whose GPU cannot hold them: the experts live in RAM and on disk, a GPU cache holds the "
            "hot ones, and the budget sliders say how many bytes go where."))
