"""Chats as desktop chat apps keep them: a new chat starts from the model's defaults (its
generation_config.json, or what the user saved for it), sampling resets to them, chats can be searched,
and an export starts in the documents folder and carries the model, the date and each answer's figures.
The real window with a stand-in engine."""

import time
from dataclasses import replace

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog

from app.chats import ChatStore
from app.paths import DEMO_MODEL
from app.protocol.events import Done, Loaded, ModelInfo, Tokens
from app.protocol.kinds import StopReason
from app.protocol.requests import LoadModel
from app.protocol.stats import CacheStats, GenerationStats
from app.ui.chats_list import documents_folder
from app.ui.main_window import MainWindow
from tests.ui.test_engine_client import INFO, StandInEngine
from tests.ui.test_keys_and_menus import next_request
from tests.ui.test_window_with_engine import CPU_ONLY


def window_with(qtbot, data_dir, info: ModelInfo):
    spawn = StandInEngine()
    window = MainWindow(data_dir, machine=CPU_ONLY, spawn=spawn)
    qtbot.addWidget(window)
    window.show()
    window.client.load(LoadModel(info.path))
    engine = spawn.spawned[0]
    engine.requests.get_nowait()
    engine.events.put(Loaded(info))
    qtbot.waitUntil(lambda: window.chat.send_button.isEnabled())
    return window, engine


def answer(window, qtbot, engine, text: str, reply: str, stats: GenerationStats | None = None) -> None:
    window.chat.composer.setPlainText(text)
    window.chat.send()
    request = next_request(engine)
    engine.events.put(Tokens([7, 8], [("answer", reply)], request.request_id))
    engine.events.put(Done(StopReason.STOP, stats, request.request_id))
    qtbot.waitUntil(lambda: window.chat.answer is None)


def test_a_new_chat_starts_from_the_models_defaults_not_the_last_chats(qtbot, tmp_path):
    window, engine = window_with(qtbot, tmp_path, replace(INFO, path=str(DEMO_MODEL)))
    settings = window.chat_settings
    assert (settings.temperature.value(), settings.top_p.value()) == (0.3, 0.9)  # the demo's generation_config
    settings.system_prompt.setPlainText("Answer in French.")
    settings.temperature.setValue(1.5)
    answer(window, qtbot, engine, "hello", "bonjour")
    assert window.store.chat(window.chat.chat_id).settings["temperature"] == 1.5
    window.menus.actions["new chat"].trigger()
    assert settings.system_prompt.toPlainText() == "" and settings.temperature.value() == 0.3

    settings.temperature.setValue(0.8)
    settings.system_prompt.setPlainText("Be brief.")
    window.menus.actions["save default"].trigger()  # this model's new chats start from these now
    window.menus.actions["new chat"].trigger()
    assert settings.temperature.value() == 0.8 and settings.system_prompt.toPlainText() == "Be brief."
    window.close()


def test_reset_sampling_goes_back_to_the_defaults_and_keeps_the_system_prompt(qtbot, tmp_path):
    window, engine = window_with(qtbot, tmp_path, replace(INFO, path=str(DEMO_MODEL)))
    answer(window, qtbot, engine, "hello", "hi")
    settings = window.chat_settings
    settings.system_prompt.setPlainText("Be brief.")
    settings.temperature.setValue(1.7)
    settings.top_k.setValue(5)
    settings.max_tokens.setValue(64)
    settings.reset_button.click()
    assert (settings.temperature.value(), settings.top_p.value(), settings.top_k.value(),
            settings.max_tokens.value()) == (0.3, 0.9, 0, 256)
    assert settings.system_prompt.toPlainText() == "Be brief."
    stored = window.store.chat(window.chat.chat_id).settings
    assert stored["temperature"] == 0.3 and stored["system_prompt"] == "Be brief."  # the chat keeps the reset
    window.close()


def test_the_search_box_finds_chats_by_title_and_by_what_was_said(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    for title, said in (("Rust lifetimes", "borrow checker"), ("Dinner", "a recipe for 100% rye bread"),
                        ("Trip", "trains to Lyon")):
        chat = store.create_chat(title)
        store.add_message(chat, None, "user", said)
    store.close()
    window = MainWindow(tmp_path, machine=CPU_ONLY, spawn=StandInEngine())
    qtbot.addWidget(window)
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()
    titles = lambda: [window.chats.list.item(row).text() for row in range(window.chats.list.count())]  # noqa: E731
    window.menus.actions["search"].trigger()
    assert window.chats.search.hasFocus()
    qtbot.keyClicks(window.chats.search, "LYON")
    assert titles() == ["Trip"]
    window.chats.search.setText("100%")  # LIKE's wildcard is searched as itself
    assert titles() == ["Dinner"]
    window.chats.search.setText("rust")
    assert titles() == ["Rust lifetimes"]
    window.chats.search.clear()
    assert titles() == ["Trip", "Dinner", "Rust lifetimes"]
    window.chats.search.setText("lyon")
    window.client.load(LoadModel(INFO.path))
    window.client.engine.events.put(Loaded(INFO))
    qtbot.waitUntil(lambda: window.chat.send_button.isEnabled())
    window.chats.new_chat()
    window.chat.composer.setPlainText("Something else")
    window.chat.send()  # a new chat shows in the list, even one the search would hide
    assert window.chats.search.text() == "" and titles()[0] == "Something else"
    assert window.chats.list.currentItem().text() == "Something else"
    window.close()


def test_an_export_starts_in_the_documents_folder_and_carries_model_date_and_figures(qtbot, tmp_path, monkeypatch):
    window, engine = window_with(qtbot, tmp_path, INFO)
    answer(window, qtbot, engine, "What is 2 + 2?", "4", GenerationStats(prefill_tokens=12, decode_tokens=1,
                                                                         ttft_s=0.25, decode_tok_s=31.5,
                                                                         expert_cache=CacheStats()))
    offered = []
    chosen = tmp_path / "exported.md"

    def save_dialog(parent, caption, directory, file_filter):
        offered.append((directory, file_filter))
        return str(chosen), file_filter

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    window.menus.actions["export markdown"].trigger()
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    assert offered == [(str(documents_folder() / "What is 2 + 2_.md"), "Markdown (*.md)")]
    assert str(documents_folder()) in (documents, str(tmp_path.home()))
    markdown = chosen.read_text()
    today = time.strftime("%Y-%m-%d")
    assert markdown.startswith(f"# What is 2 + 2?\n\n- Model: tiny\n- Date: {today} ")
    assert "## Assistant\n\n4\n\n*31.5 tok/s · first token 0.25 s · 2 tokens · finished*" in markdown
    window.close()


def test_every_sampling_value_the_settings_offer_is_one_the_engine_accepts(qtbot):
    from app.request_limits import check_temperature, check_top_k, check_top_p
    from app.ui.chat_settings import ChatSettingsPanel

    settings = ChatSettingsPanel()
    qtbot.addWidget(settings)
    for box, check in ((settings.temperature, check_temperature), (settings.top_p, check_top_p),
                       (settings.top_k, check_top_k)):
        for value in (box.minimum(), box.maximum()):
            assert check(value) == value
