"""The real window with a real engine process on the tiny model: load exactly the plan on screen,
stream, keep the local model when a remote cannot be reached, stop, regenerate, edit, continue an answer
cut at its limit, find the history after a restart, survive a killed engine, end it with Ctrl+Q.

One engine serves the module (the tests run in order and build one chat); the last test kills it."""

import os
import signal
import socket

import pytest
from PySide6.QtCore import Qt

from app.ui.budget_plan import STEPS
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow

CPU_ONLY = Machine(ram_bytes=16 * GIB)
ENGINE_S = 120_000  # ms: an engine start (torch import) on a busy 2-core machine


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moechat-data")


@pytest.fixture(scope="module")
def window(qapp, data_dir):
    window = MainWindow(data_dir, machine=CPU_ONLY)
    window.show()
    yield window
    window.close()


def ask(window, qtbot, text: str, max_tokens: int) -> None:
    window.chat_settings.max_tokens.setValue(max_tokens)
    window.chat.composer.setPlainText(text)
    qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    assert window.chat.answer is not None


def wait_for_answer(window, qtbot) -> None:
    qtbot.waitUntil(lambda: window.chat.answer is None, timeout=60_000)


def wait_for_tokens(window, qtbot, count: int) -> None:
    qtbot.waitUntil(lambda: window.chat.answer is None or window.chat.answer.tokens >= count, timeout=60_000)
    assert window.chat.answer is not None, "the answer ended before it could be interrupted"


def last_widget(window):
    return window.chat.view.widgets[-1]


def test_the_engine_loads_exactly_the_plan_on_screen(window, qtbot, tiny_gpt_oss):
    assert window.library.add_folder(str(tiny_gpt_oss))
    budget = window.budget
    assert budget.plan.placement.expert_slots == budget.plan.facts.total_experts  # the slider starts where all fit
    value = STEPS
    while budget.plan.placement is None or budget.plan.placement.expert_slots > budget.plan.facts.total_experts // 2:
        value -= 1
        budget.gpu_slider.setValue(value)
    plan = budget.plan.placement
    with qtbot.waitSignal(window.client.loaded, timeout=ENGINE_S) as loaded:
        qtbot.mouseClick(budget.load_button, Qt.MouseButton.LeftButton)
    info = loaded.args[0]
    assert (info.expert_slots, info.device_bytes, info.context) == (
        plan.expert_slots, plan.device_bytes, plan.context)
    assert f"{plan.expert_slots} of {budget.plan.facts.total_experts} experts" in window.engine_status.text()
    assert window.tabs.currentIndex() == 0 and window.chat.send_button.isEnabled()


def test_a_message_streams_in_and_is_stored_with_its_figures(window, qtbot):
    window.chat_settings.temperature.setValue(0.0)  # greedy: the long answers below run their full length
    frames = []
    window.client.tokens.connect(frames.append)
    ask(window, qtbot, "Hello there", max_tokens=24)
    assert window.chat.stop_button.isVisible() and not window.chat.send_button.isVisible()
    wait_for_answer(window, qtbot)
    window.client.tokens.disconnect(frames.append)
    assert len(frames) >= 2  # shown as it came, a frame at a time
    question, answer = window.store.branch(window.chat.chat_id)
    assert (question.role, question.content) == ("user", "Hello there")
    assert answer.complete and answer.stats["stop_reason"] in ("stop", "length")
    assert answer.stats["tokens"] == sum(len(e.token_ids) for frame in frames for e in frame)
    assert answer.stats["tok_s"] > 0 and answer.stats["ttft_s"] > 0
    assert last_widget(window).text == answer.content
    assert "tok/s" in last_widget(window).figures.text()
    assert window.chats.list.item(0).text() == "Hello there"
    charts = {"Decode speed", "Expert-cache hit rate", "Fetched per token"}  # half the experts are cached
    qtbot.waitUntil(lambda: charts <= set(window.charts.plots), timeout=5000)


def test_the_composer_shows_how_much_context_the_chat_fills(window, qtbot):
    answer = window.store.branch(window.chat.chat_id)[-1]
    context = window.client.info.context
    assert answer.stats["context_tokens"] > answer.stats["tokens"]  # the prompt's tokens and the answer's
    meter = window.chat.meter
    assert meter.isVisible() and meter.label.text().startswith(f"Context {answer.stats['context_tokens']:,} of "
                                                               f"{context:,} tokens")
    window.chat.composer.setPlainText("x" * 400)  # not sent yet: about a hundred tokens more, estimated
    assert meter.label.text().startswith(f"Context ≈ {answer.stats['context_tokens'] + 100:,} of")
    window.chat.composer.clear()


def test_an_unreachable_remote_leaves_the_local_model_loaded(window, qtbot):
    engine, info, status = window.client.engine, window.client.info, window.engine_status.text()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there
    window.remote_panel.base_url.setText(f"http://127.0.0.1:{port}/v1")
    window.remote_panel.model.setText("gpt-oss-120b")
    with qtbot.waitSignal(window.client.remote_failed, timeout=30_000) as failed:
        qtbot.mouseClick(window.remote_panel.connect_button, Qt.MouseButton.LeftButton)
    assert f"cannot reach http://127.0.0.1:{port}/v1" in failed.args[0]
    assert window.client.engine is engine and engine.process.is_alive() and window.client.remote is None
    assert window.client.info == info and window.engine_status.text() == status
    assert window.banner.isVisible() and "The model loaded before stays loaded." in window.banner.reason.text()
    assert window.settings.remote is None  # a server that failed is not offered next time
    ask(window, qtbot, "Still there?", max_tokens=4)
    wait_for_answer(window, qtbot)
    assert window.store.branch(window.chat.chat_id)[-1].complete


def test_stop_keeps_the_partial_answer(window, qtbot):
    ask(window, qtbot, "Tell me a long story", max_tokens=2000)
    wait_for_tokens(window, qtbot, 3)
    qtbot.mouseClick(window.chat.stop_button, Qt.MouseButton.LeftButton)
    wait_for_answer(window, qtbot)
    answer = window.store.branch(window.chat.chat_id)[-1]
    assert not answer.complete and answer.stats["stop_reason"] == "cancelled"
    assert 3 <= answer.stats["tokens"] < 2000
    assert "stopped" in last_widget(window).figures.text() and "incomplete" in last_widget(window).figures.text()


def test_regenerate_adds_a_sibling_and_both_stay_reachable(window, qtbot):
    first = window.store.branch(window.chat.chat_id)[-1]
    window.chat_settings.max_tokens.setValue(6)
    qtbot.mouseClick(last_widget(window).regenerate_button, Qt.MouseButton.LeftButton)
    wait_for_answer(window, qtbot)
    second = window.store.branch(window.chat.chat_id)[-1]
    assert second.id != first.id and second.parent_id == first.parent_id and second.complete
    assert [m.id for m in window.store.siblings(second.id)] == [first.id, second.id]
    assert last_widget(window).position.text() == "2 / 2"
    qtbot.mouseClick(last_widget(window).previous_button, Qt.MouseButton.LeftButton)
    assert last_widget(window).message_id == first.id and last_widget(window).position.text() == "1 / 2"


def test_edit_makes_a_branch_and_keeps_the_old_one(window, qtbot):
    before = window.store.branch(window.chat.chat_id)
    question = before[-2]
    qtbot.mouseClick(window.chat.view.widget_for(question.id).edit_button, Qt.MouseButton.LeftButton)
    assert window.chat.composer.toPlainText() == question.content and window.chat.editing_note.isVisible()
    ask(window, qtbot, "Tell me a short story", max_tokens=6)
    wait_for_answer(window, qtbot)
    edited, answer = window.store.branch(window.chat.chat_id)[-2:]
    assert edited.content == "Tell me a short story" and edited.parent_id == question.parent_id
    assert answer.parent_id == edited.id and answer.complete
    assert [m.id for m in window.store.siblings(edited.id)] == [question.id, edited.id]
    widget = window.chat.view.widget_for(edited.id)
    assert widget.position.text() == "2 / 2"
    qtbot.mouseClick(widget.previous_button, Qt.MouseButton.LeftButton)
    back = window.store.branch(window.chat.chat_id)  # the old question, with its newest answer
    assert [m.id for m in back[:-1]] == [m.id for m in before[:-1]] and back[-1].parent_id == question.id
    assert [w.message_id for w in window.chat.view.widgets] == [m.id for m in back]


def test_continue_writes_on_an_answer_that_stopped_at_its_limit(window, qtbot):
    ask(window, qtbot, "Tell me a long story", max_tokens=5)
    wait_for_answer(window, qtbot)
    cut = window.store.branch(window.chat.chat_id)[-1]
    assert cut.stats["stop_reason"] == "length"
    qtbot.waitUntil(lambda: last_widget(window).continue_button.isVisible())
    qtbot.mouseClick(last_widget(window).continue_button, Qt.MouseButton.LeftButton)
    assert last_widget(window).continue_button.isHidden()  # one answer at a time
    wait_for_answer(window, qtbot)
    continued = window.store.branch(window.chat.chat_id)[-1]
    assert continued.id == cut.id  # the same message, written on
    assert continued.content.startswith(cut.content) and continued.stats["tokens"] > cut.stats["tokens"]
    assert continued.reasoning.startswith(cut.reasoning)


def test_the_history_is_there_after_a_restart(window, qtbot, data_dir, tiny_gpt_oss):
    chat_id = window.chat.chat_id
    expected = [(m.role, m.content) for m in window.store.branch(chat_id)]
    again = MainWindow(data_dir, machine=CPU_ONLY)
    qtbot.addWidget(again)
    again.show()
    assert again.chats.list.count() == 1 and again.chat.chat_id == chat_id
    assert [(w.role, w.text) for w in again.chat.view.widgets] == expected
    qtbot.waitUntil(lambda: again.library.selected_path() == str(tiny_gpt_oss.resolve()))  # the last model loaded
    assert again.library.list.count() == 2 and not again.client.running  # beside the demo; loaded only by the app
    again.close()


def test_a_killed_engine_leaves_the_window_working(window, qtbot):
    ask(window, qtbot, "One more long story", max_tokens=2000)
    wait_for_tokens(window, qtbot, 3)
    answer_id = window.chat.answer.message_id
    with qtbot.waitSignal(window.client.died, timeout=10_000):
        os.kill(window.client.engine.process.pid, signal.SIGKILL)
    assert window.banner.isVisible() and "killed (out of memory?)" in window.banner.reason.text()
    partial = window.store.message(answer_id)
    assert not partial.complete and partial.stats["stop_reason"] == "the engine was killed (out of memory?)"
    assert partial.stats["tokens"] >= 3 and window.chat.view.widget_for(answer_id).text == partial.content
    assert not window.chat.send_button.isEnabled()

    with qtbot.waitSignal(window.client.loaded, timeout=ENGINE_S):
        qtbot.mouseClick(window.banner.restart_button, Qt.MouseButton.LeftButton)
    assert not window.banner.isVisible()
    ask(window, qtbot, "Are you back?", max_tokens=4)
    wait_for_answer(window, qtbot)
    answer = window.store.branch(window.chat.chat_id)[-1]
    assert answer.complete and answer.stats["tokens"] >= 1


def test_ctrl_q_ends_the_engine_with_the_window(window, qtbot):
    process = window.client.engine.process
    with qtbot.waitActive(window):
        window.activateWindow()  # a shortcut works in the active window
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert not window.isVisible() and window.client.engine is None
    assert process.exitcode is not None and not process.is_alive()
