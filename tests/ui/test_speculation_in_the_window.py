"""Speculation from the window: the load request carries what the speculation panel says, a real engine
loads the tiny model with a DFlash drafter and answers with the speculation and residency charts
filling; a drafter that cannot be used is refused in words."""

import pytest
from PySide6.QtCore import Qt

from app.ui.charts import RESIDENCY
from app.ui.main_window import MainWindow
from tests.ui.test_window_with_engine import CPU_ONLY, ENGINE_S, ask, wait_for_answer


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    window = MainWindow(tmp_path_factory.mktemp("moechat-data"), machine=CPU_ONLY)
    window.show()
    yield window
    window.close()


def choose(window, method: str, drafter: str = "", block_size: int = 0) -> None:
    panel = window.budget.speculation
    panel.method.setCurrentIndex(panel.method.findData(method))
    panel.drafter.setText(drafter)
    panel.block_size.setValue(block_size)


def test_mtp_is_offered_only_for_glm_models(window, tiny_gpt_oss):
    assert window.library.add_folder(str(tiny_gpt_oss))
    panel = window.budget.speculation
    assert not panel.method.model().item(panel.method.findData("mtp")).isEnabled()
    assert panel.method.model().item(panel.method.findData("dflash")).isEnabled()
    choose(window, "off")
    assert not panel.drafter.isVisibleTo(window) and not panel.block_size.isVisibleTo(window)


def test_a_drafter_that_cannot_be_used_is_refused_in_words(window, qtbot):
    choose(window, "dflash", drafter="", block_size=3)
    with qtbot.waitSignal(window.client.error, timeout=ENGINE_S) as error:
        qtbot.mouseClick(window.budget.load_button, Qt.MouseButton.LeftButton)
    assert error.args[0].kind == "load"
    assert window.client.last_load.spec == "dflash" and window.client.last_load.block_size == 3
    assert window.banner.isVisible() and "needs the drafter's folder" in window.banner.reason.text()
    assert window.client.info is None


def test_the_engine_speculates_with_the_drafter_chosen_in_the_window(window, qtbot, tiny_dflash):
    choose(window, "dflash", drafter=str(tiny_dflash))
    with qtbot.waitSignal(window.budget.load_requested) as requested, \
            qtbot.waitSignal(window.client.loaded, timeout=ENGINE_S) as loaded:
        qtbot.mouseClick(window.budget.load_button, Qt.MouseButton.LeftButton)
    request = requested.args[0]
    assert (request.spec, request.drafter, request.block_size) == ("dflash", str(tiny_dflash), None)
    assert loaded.args[0].spec == "dflash" and not window.banner.isVisible()

    window.chat_settings.temperature.setValue(0.0)
    steps = []
    window.client.tokens.connect(lambda events: steps.extend(e.spec for e in events if e.spec is not None))
    ask(window, qtbot, "Hello there", max_tokens=48)
    wait_for_answer(window, qtbot)
    answer = window.store.branch(window.chat.chat_id)[-1]
    assert answer.complete and steps and "mean_accepted" in answer.stats
    assert "accepted per step" in window.chat.view.widgets[-1].figures.text()
    qtbot.waitUntil(lambda: {"Speculation per step", RESIDENCY} <= set(window.charts.plots), timeout=5000)
    sizes = [s.block_size for s in steps]
    qtbot.waitUntil(lambda: list(window.charts.curves["block_size"].getData()[1])[-len(sizes):] == sizes,
                    timeout=2000)  # the next redraw has every step
    facts = window.budget.plan.facts
    residency = window.charts.residency_image.image * facts.num_experts  # [T, layers]: resident experts
    assert residency.shape[1] == len(facts.moe_layers) and (residency == residency.round()).all()
    assert 0 < residency[-1].sum() <= loaded.args[0].expert_slots  # the drafter took some of the slots
