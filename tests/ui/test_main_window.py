import json
import subprocess
import sys

from app.chats import ChatStore
from app.ui.chats_list import export_chat
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow


def test_importing_the_ui_does_not_load_torch():
    code = ("import pkgutil, importlib, sys, app.ui\n"
            "for module in pkgutil.iter_modules(app.ui.__path__):\n"
            "    importlib.import_module('app.ui.' + module.name)\n"
            "import app.plan, app.model_folder, app.hub, app.chats\n"
            "print(len(list(pkgutil.iter_modules(app.ui.__path__))), 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    count, torch_loaded = result.stdout.split()
    assert int(count) >= 10 and torch_loaded == "False"


def test_the_window_opens_without_a_model_or_an_engine(qtbot, tmp_path):
    window = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    assert window.windowTitle() == "MoE Chat"
    assert not window.client.running and window.engine_status.text() == "No model loaded"
    assert not window.chat.send_button.isEnabled()
    assert window.chats.list.count() == 0 and window.chat.view.widgets == []
    window.close()
    assert (tmp_path / "chats.sqlite").is_file()


def test_chats_are_renamed_deleted_and_exported(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    first = store.create_chat("First")
    question = store.add_message(first, None, "user", "What is **MoE**?")
    store.add_message(first, question, "assistant", "Experts.", reasoning="short")
    second = store.create_chat("Second")
    store.close()
    window = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(window)
    assert window.chat.chat_id == second and [window.chats.list.item(i).text() for i in range(2)] == [
        "Second", "First"]
    window.chats.select(first)
    assert window.chats.list.currentItem().text() == "First"
    assert [w.text for w in window.chat.view.widgets] == ["What is **MoE**?", "Experts."]
    assert window.chat.view.widgets[1].reasoning_toggle.text() == "Reasoning (1 word)"
    assert not window.chat.view.widgets[1].reasoning.isVisibleTo(window)
    window.chats.rename(first, "Renamed")
    assert window.store.chat(first).title == "Renamed"
    export_chat(window.store, first, tmp_path / "chat.md")
    export_chat(window.store, first, tmp_path / "chat.json")
    assert (tmp_path / "chat.md").read_text().startswith("# Renamed")
    assert [m["content"] for m in json.loads((tmp_path / "chat.json").read_text())["messages"]] == [
        "What is **MoE**?", "Experts."]
    window.chats.delete(second)
    assert [c.title for c in window.store.chats()] == ["Renamed"] and window.chat.chat_id is None
    window.close()
