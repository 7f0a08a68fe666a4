"""With no model installed, the window opens with the bundled demo model listed and selected."""

from app.paths import DEMO_MODEL
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow


def test_the_demo_model_is_selected_when_no_other_model_is_installed(qtbot, tmp_path):
    window = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.library.selected_path() == str(DEMO_MODEL))
    assert window.library.list.count() == 1
    assert window.budget.facts is not None and window.budget.facts.model_type == "gpt_oss"
    assert window.settings.library == []  # offered, not installed
    window.close()


def test_an_installed_model_keeps_the_demo_out_of_the_library(qtbot, tmp_path, tiny_gpt_oss):
    first = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(first)
    assert first.library.add_folder(str(tiny_gpt_oss))
    qtbot.wait(10)  # the demo's deferred selection must not take over the folder just added
    assert first.library.selected_path() == str(tiny_gpt_oss.resolve()) and first.library.list.count() == 1
    first.close()
    again = MainWindow(tmp_path, machine=Machine(16 * GIB))
    qtbot.addWidget(again)
    qtbot.wait(10)
    assert again.library.list.count() == 1 and again.library.selected_path() is None
    again.close()
