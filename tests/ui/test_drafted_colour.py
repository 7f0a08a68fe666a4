"""Answer text from accepted drafts in its own colour when the chat's setting asks for it, driven by
synthetic Tokens events from a stand-in engine."""

from dataclasses import replace

from app.chats import ChatStore
from app.protocol.events import Done, Loaded, SpecStep, Tokens
from app.protocol.kinds import StopReason
from app.protocol.requests import LoadModel
from app.ui.conversation import Answer
from app.ui.main_window import MainWindow
from app.ui.message_html import markdown_html
from app.ui.theme import current
from tests.ui.test_engine_client import INFO, StandInEngine
from tests.ui.test_window_with_engine import CPU_ONLY


def drafted() -> str:
    """The opening tag of drafted text in the theme in force."""
    return f'<span style="color:{current().drafted}">'


def spec(accepted: int) -> SpecStep:
    return SpecStep(accepted + 1, accepted, 1.0, 0, 0, 0, 0.0, 0.0)


def test_an_answer_knows_which_text_came_from_steps_with_accepted_drafts(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("t")
    answer = Answer(store, chat, store.add_message(chat, None, "user", "hi"), request_id=1)
    answer.add([Tokens([1], [("answer", "one ")], 1, [False], spec(0)),
                Tokens([2, 3], [("answer", "two ")], 1, [True, False], spec(1)),
                Tokens([4, 5, 6], [("reasoning", "hm"), ("answer", "three")], 1, [True, True, False], spec(2)),
                Tokens([7], [("answer", " four")], 1, [False], spec(0))])
    assert answer.text == "one two three four" and answer.drafted_spans == [[4, 13]]
    assert answer.finish(Done(StopReason.STOP, None, 1))["drafted_spans"] == [[4, 13]]
    html, _ = markdown_html(answer.text, answer.drafted_spans)
    assert html == f"<p>one {drafted()}two three</span> four</p>\n"
    store.close()


def test_drafted_text_is_coloured_when_the_setting_is_on_and_not_when_off(qtbot, tmp_path):
    spawn = StandInEngine()
    window = MainWindow(tmp_path, machine=CPU_ONLY, spawn=spawn)
    qtbot.addWidget(window)
    window.client.load(LoadModel("tiny", spec="dflash", drafter="drafter"))
    events = spawn.spawned[0].events
    events.put(Loaded(replace(INFO, path="tiny", spec="dflash")))
    qtbot.waitUntil(lambda: window.chat.send_button.isEnabled())
    window.chat.composer.setPlainText("hi")
    window.chat.send()
    request_id = window.chat.answer.request_id
    events.put(Tokens([1], [("answer", "plain ")], request_id, [False], spec(0)))
    events.put(Tokens([2, 3], [("answer", "guessed")], request_id, [True, False], spec(1)))

    def body() -> str:
        return window.chat.view.widgets[-1].body.text()

    qtbot.waitUntil(lambda: "guessed" in body())
    assert drafted() not in body()
    window.chat_settings.colour_drafted.setChecked(True)
    assert f"plain {drafted()}guessed</span>" in body()  # while it streams

    events.put(Done(StopReason.STOP, None, request_id))
    qtbot.waitUntil(lambda: window.chat.answer is None)
    assert f"plain {drafted()}guessed</span>" in body()  # stored with the message
    assert window.store.branch(window.chat.chat_id)[-1].stats["drafted_spans"] == [[6, 13]]
    window.chat_settings.colour_drafted.setChecked(False)
    assert drafted() not in body() and "plain guessed" in body()
    window.close()


def test_colouring_keeps_the_markdown_blocks_it_crosses():
    text = "# Title\n- item one\n\n```py\nx = 1\n```\n"
    html, blocks = markdown_html(text, [[0, len(text)]])
    assert html.startswith(f"<h1>{drafted()}Title</span></h1>\n<ul>\n<li>{drafted()}item one</span></li>")
    assert f"<pre>{drafted()}x = 1</span></pre>" in html and blocks == ["x = 1\n"]
