"""The real window chatting through a remote backend: a real `moechat serve` subprocess, no local engine."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from PySide6.QtCore import Qt

from app.answer_figures import stats_line
from app.chats import ChatStore
from app.protocol.events import Done, Tokens
from app.protocol.kinds import StopReason
from app.protocol.stats import RemoteStats
from app.remote import RemoteModel
from app.ui.conversation import Answer
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow

CPU_ONLY = Machine(ram_bytes=16 * GIB)


@pytest.fixture
def window(qapp, tmp_path):
    window = MainWindow(tmp_path, machine=CPU_ONLY)
    window.show()
    yield window
    window.close()


def connect(window, qtbot, server, api_key: str):
    panel = window.remote_panel
    panel.base_url.setText(server.base_url)
    panel.model.setText(server.model)
    panel.api_key.setText(api_key)
    qtbot.mouseClick(panel.connect_button, Qt.MouseButton.LeftButton)


def ask(window, qtbot, text: str, max_tokens: int) -> None:
    window.chat_settings.temperature.setValue(0.0)
    window.chat_settings.max_tokens.setValue(max_tokens)
    window.chat.composer.setPlainText(text)
    qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    assert window.chat.answer is not None


def test_a_chat_through_a_remote_server_answers_as_the_server_does(window, qtbot, served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    with qtbot.waitSignal(window.client.loaded, timeout=30_000) as loaded:
        connect(window, qtbot, server, server.api_key)
    assert isinstance(loaded.args[0], RemoteModel) and window.client.engine is None  # no local engine process
    assert "unavailable from a remote server" in window.engine_status.text()
    assert window.settings.remote["base_url"] == server.base_url  # offered again next time

    ask(window, qtbot, "Hello there", max_tokens=10)
    qtbot.waitUntil(lambda: window.chat.answer is None, timeout=60_000)
    question, answer = window.store.branch(window.chat.chat_id)
    direct = openai.OpenAI(base_url=server.base_url, api_key=server.api_key).chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=10, temperature=0)
    assert question.content == "Hello there" and answer.content == direct.choices[0].message.content
    assert answer.reasoning == (direct.choices[0].message.model_extra.get("reasoning_content") or "")
    assert answer.complete and answer.stats["tokens"] == direct.usage.completion_tokens
    assert answer.stats["tok_s"] > 0  # moechat says its decode speed


def test_stopping_a_remote_answer_ends_its_generation_on_the_server(window, qtbot, served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    with qtbot.waitSignal(window.client.loaded, timeout=30_000):
        connect(window, qtbot, server, server.api_key)
    ask(window, qtbot, "Tell me everything", max_tokens=400)
    qtbot.waitUntil(lambda: window.chat.answer is None or window.chat.answer.tokens >= 3, timeout=60_000)
    qtbot.mouseClick(window.chat.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.chat.answer is None, timeout=30_000)
    answer = window.store.branch(window.chat.chat_id)[-1]
    assert not answer.complete and answer.stats["stop_reason"] == "cancelled"
    qtbot.waitUntil(lambda: server.status()["in_flight"] == 0, timeout=30_000)
    ended = server.status()["recent"][-1]
    assert ended["cancelled_because"] == "client disconnected" and ended["generated_tokens"] < 400


def test_a_wrong_key_is_said_in_the_banner(window, qtbot, served_tiny_gpt_oss):
    with qtbot.waitSignal(window.client.remote_failed, timeout=30_000):
        connect(window, qtbot, served_tiny_gpt_oss, "not-the-key")
    assert window.banner.isVisible() and "401: invalid API key" in window.banner.reason.text()
    assert not window.chat.send_button.isEnabled()


def test_figures_a_remote_does_not_give_are_unavailable_not_zero(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("t")
    answer = Answer(store, chat, store.add_message(chat, None, "user", "hi"), request_id=1)
    answer.add([Tokens([], [("answer", "Hello")], 1)])  # a server that sends text but no token ids
    stats = answer.finish(Done(StopReason.STOP, RemoteStats(completion_tokens=None, ttft_s=0.25), 1))
    assert stats_line(stats) == "tok/s unavailable · first token 0.25 s · tokens unavailable · finished"
    store.close()


def test_a_server_that_does_not_speak_the_api_is_said_in_the_banner(window, qtbot):
    class NotTheApi(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>a web page</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotTheApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        window.remote_panel.base_url.setText(f"http://127.0.0.1:{server.server_port}/v1")
        window.remote_panel.model.setText("any")
        with qtbot.waitSignal(window.client.remote_failed, timeout=30_000) as failed:
            qtbot.mouseClick(window.remote_panel.connect_button, Qt.MouseButton.LeftButton)
    finally:
        server.shutdown()
        server.server_close()
    assert "gave an answer that cannot be read" in failed.args[0] and window.banner.isVisible()
    assert window.client.remote is None
