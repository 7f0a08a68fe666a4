"""The window as the app opens it (`load_at_start`), with real engine processes: the first run loads the
demo and chats with its shipped sampling; after a restart the last model is loaded again with its exact
plan; with the setting off it is only selected."""

from dataclasses import asdict

from PySide6.QtCore import Qt

from app.paths import DEMO_MODEL
from app.ui.budget_plan import STEPS
from app.ui.main_window import MainWindow
from tests.ui.test_window_with_engine import CPU_ONLY, ENGINE_S


def open_app(qtbot, data_dir) -> MainWindow:
    window = MainWindow(data_dir, machine=CPU_ONLY, load_at_start=True)
    qtbot.addWidget(window)
    window.show()
    return window


def test_the_first_run_loads_the_demo_and_a_new_chat_takes_its_sampling(qtbot, tmp_path):
    window = open_app(qtbot, tmp_path)
    with qtbot.waitSignal(window.client.loaded, timeout=ENGINE_S) as loaded:
        pass
    info = loaded.args[0]
    assert info.path == str(DEMO_MODEL) and info.spec == "dflash"  # with its drafter
    assert window.library.selected_path() == str(DEMO_MODEL) and "25 MB toy" in window.library.card.text()
    settings = window.chat_settings.settings()  # the demo's generation_config.json, not temperature 1.0
    assert (settings["temperature"], settings["top_p"], settings["max_tokens"]) == (0.3, 0.9, 256)
    assert window.settings.last_load == asdict(window.client.last_load)
    engine = window.client.engine.process
    window.close()
    assert not engine.is_alive()


def test_the_last_model_is_loaded_again_with_its_plan_and_the_setting_can_turn_that_off(qtbot, tmp_path,
                                                                                         tiny_gpt_oss):
    first = open_app(qtbot, tmp_path)
    assert first.library.add_folder(str(tiny_gpt_oss))  # before the deferred start: it keeps this choice
    budget = first.budget
    value = STEPS
    while budget.plan.placement is None or budget.plan.placement.expert_slots == budget.plan.facts.total_experts:
        value -= 1
        budget.gpu_slider.setValue(value)  # the first step that leaves experts out of the slots
    budget.ram_slider.setValue(STEPS * 2 // 5)
    budget.context.setCurrentIndex(budget.context.findData(2048))
    with qtbot.waitSignal(first.client.loaded, timeout=ENGINE_S):
        qtbot.mouseClick(budget.load_button, Qt.MouseButton.LeftButton)
    request = first.client.last_load
    assert (request.gpu_budget, request.ram_budget, request.context) == (budget.plan.gpu_budget,
                                                                         budget.plan.ram_budget, 2048)
    first.close()

    again = open_app(qtbot, tmp_path)
    with qtbot.waitSignal(again.client.loaded, timeout=ENGINE_S) as loaded:
        pass
    assert again.client.last_load == request and loaded.args[0].path == request.path  # the same plan, exactly
    assert again.library.selected_path() == request.path
    assert (again.budget.plan.gpu_budget, again.budget.plan.ram_budget, again.budget.context.currentData()) == (
        request.gpu_budget, request.ram_budget, 2048)  # and on screen
    again.menus.actions["load at start"].setChecked(False)
    again.close()

    third = open_app(qtbot, tmp_path)
    qtbot.waitUntil(lambda: third.library.selected_path() == request.path)
    qtbot.wait(200)
    assert not third.client.running and third.budget.plan.gpu_budget == request.gpu_budget  # selected, not loaded
    assert not third.menus.actions["load at start"].isChecked()
    third.close()
