"""With no model installed, the window opens with the bundled demo model listed and selected, its drafter
chosen for speculation."""

from PySide6.QtCore import Qt

from app.paths import DEMO_DRAFTER, DEMO_MODEL
from app.ui.hardware import GIB, Machine
from app.ui.library import DEMO_TITLE
from app.ui.main_window import MainWindow
from tests.ui.test_window_with_engine import CPU_ONLY, ENGINE_S, ask, wait_for_answer


def test_the_demo_model_is_selected_when_no_other_model_is_installed(qtbot, tmp_path):
    window = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.library.selected_path() == str(DEMO_MODEL))
    assert window.library.list.count() == 1 and window.library.list.item(0).text().startswith(DEMO_TITLE)
    assert not window.client.running  # selected only: the app loads it at start (tests/ui/test_first_run.py)
    assert window.budget.plan.facts is not None and window.budget.plan.facts.model_type == "gpt_oss"
    assert window.settings.library == []  # offered, not installed
    assert window.budget.speculation.options() == {"spec": "dflash", "drafter": str(DEMO_DRAFTER), "block_size": None}
    assert "as measured on real text" in window.budget.details.text()  # the demo's routing.json
    window.close()


def test_the_demo_stays_in_the_library_beside_installed_models(qtbot, tmp_path, tiny_gpt_oss):
    first = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(first)
    assert first.library.add_folder(str(tiny_gpt_oss))
    qtbot.wait(10)  # the deferred start must not take over the folder just added
    assert first.library.selected_path() == str(tiny_gpt_oss.resolve())
    assert first.budget.speculation.options()["spec"] == "off"  # the demo's drafter does not follow another model
    assert first.library.card.text() == str(tiny_gpt_oss.resolve())
    first.close()
    again = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(again)
    qtbot.wait(10)
    assert again.library.paths() == [str(DEMO_MODEL), str(tiny_gpt_oss.resolve())]
    assert again.library.list.item(0).text().startswith(f"{DEMO_TITLE}\n")
    assert again.library.selected_path() is None  # nothing was loaded, and there is more than the demo
    again.library.select(str(DEMO_MODEL))
    assert "25 MB toy" in again.library.card.text() and not again.library.remove_button.isEnabled()
    again.close()


def test_the_demo_answers_out_of_the_box_with_its_drafter(qtbot, tmp_path):
    """What a newcomer does: open the app, press Load, ask a question; the bundled pair answers in words
    from its training data, with drafted tokens kept."""
    window = MainWindow(tmp_path, machine=CPU_ONLY)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.library.selected_path() == str(DEMO_MODEL))
    with qtbot.waitSignal(window.client.loaded, timeout=ENGINE_S) as loaded:
        qtbot.mouseClick(window.budget.load_button, Qt.MouseButton.LeftButton)
    assert loaded.args[0].spec == "dflash" and not window.banner.isVisible()
    window.chat_settings.temperature.setValue(0.0)
    ask(window, qtbot, "What does `json.dumps` do?", max_tokens=48)
    wait_for_answer(window, qtbot)
    answer = window.store.branch(window.chat.chat_id)[-1]
    assert answer.complete and answer.stats["mean_accepted"] > 0
    assert len(answer.content.split()) >= 5 and "\ufffd" not in answer.content  # words, not broken bytes
    window.close()
