"""The keys and menus a chat app has: Enter sends, Shift+Enter starts a new line, Esc stops or leaves an
edit, Ctrl+N, Ctrl+Q, a File / Chat / Model / View / Help menu bar. Driven by key presses on the real
window, with a stand-in engine whose queues the test reads and fills."""

import queue

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence

from app.protocol.events import Done, Loaded, Tokens
from app.protocol.kinds import StopReason
from app.protocol.requests import Cancel, Generate, LoadModel, Shutdown
from app.ui.main_window import MainWindow
from tests.ui.test_engine_client import INFO, StandInEngine
from tests.ui.test_window_with_engine import CPU_ONLY


def loaded_window(qtbot, data_dir):
    """A shown, active window with a stand-in engine that has 'loaded' a model; (window, engine)."""
    spawn = StandInEngine()
    window = MainWindow(data_dir, machine=CPU_ONLY, spawn=spawn)
    qtbot.addWidget(window)
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()  # a shortcut works in the active window
    window.client.load(LoadModel("/models/tiny"))
    engine = spawn.spawned[0]
    assert isinstance(engine.requests.get_nowait(), LoadModel)
    engine.events.put(Loaded(INFO))
    qtbot.waitUntil(lambda: window.chat.send_button.isEnabled())
    window.chat.composer.setFocus()
    return window, engine


def next_request(engine):
    return engine.requests.get(timeout=2)


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, tmp_path):
    window, engine = loaded_window(qtbot, tmp_path)
    composer = window.chat.composer
    assert "Enter sends" in composer.placeholderText()
    qtbot.keyClicks(composer, "first line")
    qtbot.keyClick(composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer, "second line")
    assert composer.toPlainText() == "first line\nsecond line" and window.chat.answer is None
    qtbot.keyClick(composer, Qt.Key.Key_Return)
    request = next_request(engine)
    assert isinstance(request, Generate)
    assert request.messages[-1] == {"role": "user", "content": "first line\nsecond line"}
    assert composer.toPlainText() == "" and window.chat.answer is not None
    window.close()


def test_esc_stops_the_answer_then_leaves_an_edit(qtbot, tmp_path):
    window, engine = loaded_window(qtbot, tmp_path)
    composer = window.chat.composer
    qtbot.keyClicks(composer, "Tell me a story")
    qtbot.keyClick(composer, Qt.Key.Key_Enter)
    request = next_request(engine)
    engine.events.put(Tokens([5], [("answer", "Once")], request.request_id))
    qtbot.waitUntil(lambda: window.chat.answer.tokens == 1)
    qtbot.keyClick(composer, Qt.Key.Key_Escape)
    assert next_request(engine) == Cancel()
    engine.events.put(Done(StopReason.CANCELLED, None, request.request_id))
    qtbot.waitUntil(lambda: window.chat.answer is None)
    assert window.store.branch(window.chat.chat_id)[-1].content == "Once"

    question = window.chat.view.widgets[0]
    qtbot.mouseClick(question.edit_button, Qt.MouseButton.LeftButton)
    assert composer.toPlainText() == "Tell me a story" and window.chat.editing_note.isVisible()
    qtbot.keyClick(composer, Qt.Key.Key_Escape)
    assert composer.toPlainText() == "" and not window.chat.editing_note.isVisible()
    assert window.chat.editing_id is None
    window.close()


def test_ctrl_n_opens_a_new_chat(qtbot, tmp_path):
    window, engine = loaded_window(qtbot, tmp_path)
    qtbot.keyClicks(window.chat.composer, "hello")
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_Return)
    request = next_request(engine)
    engine.events.put(Done(StopReason.STOP, None, request.request_id))
    qtbot.waitUntil(lambda: window.chat.answer is None)
    first = window.chat.chat_id
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat.chat_id is None and window.chat.view.widgets == []
    assert [c.id for c in window.store.chats()] == [first]  # nothing stored until the first message
    window.close()


def test_ctrl_q_quits_and_the_engine_is_told_to_end(qtbot, tmp_path):
    window, engine = loaded_window(qtbot, tmp_path)
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert not window.isVisible() and window.client.engine is None
    assert next_request(engine) == Cancel() and next_request(engine) == Shutdown()
    assert engine.process.exitcode == 0
    try:
        extra = engine.requests.get_nowait()
    except queue.Empty:
        extra = None
    assert extra is None


def test_the_menu_bar_has_the_actions_with_their_shortcuts(qtbot, tmp_path):
    window = MainWindow(tmp_path, machine=CPU_ONLY, spawn=StandInEngine())
    qtbot.addWidget(window)
    menus = [action.text().replace("&", "") for action in window.menuBar().actions()]
    assert menus == ["File", "Chat", "Model", "View", "Help"]
    shortcuts = {name: action.shortcut() for name, action in window.menus.actions.items()}
    assert shortcuts["new chat"] == QKeySequence("Ctrl+N") and shortcuts["quit"] == QKeySequence("Ctrl+Q")
    assert shortcuts["stop"] == QKeySequence("Esc") and shortcuts["search"] == QKeySequence("Ctrl+F")
    window.menus.actions["show models"].trigger()
    assert window.tabs.currentIndex() == 1
    window.menus.actions["show live"].trigger()
    assert window.tabs.currentIndex() == 0 and window.side_tabs.currentIndex() == 1
    window.close()
