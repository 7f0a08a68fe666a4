"""The budget panel on gpt-oss-20b's real tensor table: sliders bounded by the machine and the
model, the plan and the predicted speed following the sliders, impossible plans refused."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.model_folder import ModelFolder
from app.paths import DEMO_MODEL
from app.plan import ModelFacts, plan_placement, predict_decode
from app.plan_cpu import CPU_HARDWARE
from app.protocol.requests import LoadModel
from app.ui.budget_plan import STEPS
from app.ui.hardware import GIB, Machine

RTX_4090 = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4090", gpu_bytes=24 * GIB, pcie_gen=4)
SMALL_GPU = Machine(ram_bytes=8 * GIB, gpu_name="NVIDIA GeForce RTX 4060", gpu_bytes=8 * GIB, pcie_gen=4)
NO_GPU = Machine(ram_bytes=16 * GIB)


def test_the_sliders_end_at_the_machine_or_where_everything_fits(panel, gpt_oss_20b):
    facts = ModelFacts.from_folder(ModelFolder.open(gpt_oss_20b))
    everything = plan_placement(facts, None, None, 4096, 2)
    roomy = panel(RTX_4090, gpt_oss_20b)
    assert roomy.plan.gpu_max == everything.device_bytes < 24 * GIB
    assert roomy.plan.ram_max == facts.total_experts * facts.expert_bytes
    assert roomy.plan.placement.expert_slots == facts.total_experts and roomy.plan.placement.disk_experts == 0
    assert roomy.plan.prediction.hit_rate == 1.0 and "RTX 4090" in roomy.machine_label.text()
    small = panel(SMALL_GPU, gpt_oss_20b)
    assert small.plan.gpu_max == 8 * GIB and small.plan.ram_max == 8 * GIB
    assert small.plan.gpu_budget == pytest.approx(0.9 * 8 * GIB, rel=0.002)  # room for the desktop
    assert small.plan.placement.disk_experts > 0  # 75 % of 8 GiB RAM cannot hold 9.5 GiB of experts


def test_moving_the_gpu_slider_changes_the_plan_and_the_speed_as_it_moves(panel, gpt_oss_20b, qtbot):
    budget = panel(RTX_4090, gpt_oss_20b)
    seen = []
    for _ in range(6):
        qtbot.keyClick(budget.gpu_slider, Qt.Key.Key_PageDown)
        seen.append((budget.plan.placement.expert_slots, budget.plan.prediction.tok_s_low, budget.bar.rows[0][1][3][1]))
    slots, speeds, slot_bytes = zip(*seen, strict=True)
    assert list(slots) == sorted(slots, reverse=True) and len(set(slots)) == 6
    assert list(speeds) == sorted(speeds, reverse=True)
    assert [s * budget.plan.facts.expert_bytes for s in slots] == list(slot_bytes)  # the bar draws this plan
    assert budget.speed.text().startswith("Predicted decode:") and "limited by" in budget.details.text()


def test_an_impossible_plan_is_refused_with_the_reason(panel, gpt_oss_20b):
    budget = panel(RTX_4090, gpt_oss_20b)
    budget.gpu_slider.setValue(STEPS // 10)  # 1.3 GiB: less than the resident weights
    assert budget.plan.placement is None and not budget.load_button.isEnabled()
    assert "This plan cannot run: GPU budget" in budget.refusal.text() and "too small" in budget.refusal.text()
    assert not budget.bar.isVisible() and not budget.speed.isVisible() and budget.refusal.isVisible()
    budget.gpu_slider.setValue(STEPS)
    assert budget.plan.placement is not None and budget.load_button.isEnabled() and budget.refusal.text() == ""


def test_experts_past_the_ram_budget_are_read_from_disk(panel, gpt_oss_20b):
    budget = panel(RTX_4090, gpt_oss_20b)
    budget.gpu_slider.setValue(STEPS // 2)
    in_ram = budget.plan.prediction
    budget.ram_slider.setValue(0)
    plan = budget.plan
    assert plan.placement.host_experts == 0 and plan.placement.disk_experts == plan.facts.total_experts
    assert budget.plan.prediction.bound == "disk" and budget.plan.prediction.tok_s_low < in_ram.tok_s_low


def test_the_load_request_is_exactly_the_plan_on_screen(panel, gpt_oss_20b, qtbot):
    budget = panel(RTX_4090, gpt_oss_20b)
    budget.gpu_slider.setValue(700)
    budget.ram_slider.setValue(900)
    budget.context.setCurrentIndex(budget.context.findData(8192))
    with qtbot.waitSignal(budget.load_requested) as requested:
        qtbot.mouseClick(budget.load_button, Qt.MouseButton.LeftButton)
    assert requested.args[0] == LoadModel(gpt_oss_20b, device="cuda", dtype="bfloat16",
                                          gpu_budget=budget.plan.gpu_budget, ram_budget=budget.plan.ram_budget,
                                          context=8192, max_batch=1)  # the window asks for one answer at a time
    assert budget.plan.placement.context == 8192


def test_a_folder_that_is_not_a_model_is_explained(panel, tmp_path):
    budget = panel(RTX_4090, str(tmp_path))
    assert "config.json is missing" in budget.title.text() and not budget.load_button.isEnabled()


def test_without_a_gpu_the_panel_says_memory_and_plans_for_the_cpu(panel, gpt_oss_20b):
    budget = panel(NO_GPU, gpt_oss_20b)
    assert budget.gpu_label.text().startswith("Memory budget") and budget.ram_label.text().startswith("RAM expert")
    assert budget.plan.gpu_max == 16 * GIB  # float32 on the CPU: 20 GB for all of it
    facts = ModelFacts.from_folder(ModelFolder.open(gpt_oss_20b))
    plan = budget.plan
    assert plan.prediction == predict_decode(facts, plan.placement, 4, CPU_HARDWARE)  # float32, the CPU's rates
    # both budgets are RAM here: the plan the panel starts with fits in it, both together
    assert budget.plan.placement.device_bytes + budget.plan.placement.host_bytes <= 0.9 * 16 * GIB
    assert not budget.warning.isVisible()
    budget.ram_slider.setValue(STEPS)
    assert budget.warning.isVisible() and "exceed this machine's 16.00 GiB of RAM" in budget.warning.text()
    assert budget.load_button.isEnabled()  # loading anyway stays possible
    budget.gpu_slider.setValue(STEPS // 100)
    assert "This plan cannot run: memory budget" in budget.refusal.text()
    shown = [label.text() for label in budget.findChildren(QLabel) if label is not budget.machine_label]
    assert not [text for text in shown if "GPU" in text], shown  # the machine has none: no message names one


def test_the_sliders_scale_to_a_tiny_model(panel):
    """The demo (25 MB) on a 16 GiB machine: the device slider ends where the whole plan fits (twice that
    with speculation, for the drafter), not at the machine's 16 GiB, so its steps are of use."""
    budget = panel(NO_GPU, str(DEMO_MODEL))
    assert budget.speculation.options()["spec"] == "dflash"  # the demo comes with its drafter
    everything = plan_placement(budget.plan.facts, None, None, budget.context.currentData(), 4)
    assert budget.plan.gpu_max == 2 * everything.device_bytes < 1 * GIB
    runnable = 0
    for value in range(0, STEPS + 1, 10):
        budget.gpu_slider.setValue(value)
        runnable += budget.plan.placement is not None
    assert runnable >= 50  # at least half of the slider's travel is a plan that runs
    budget.speculation.method.setCurrentIndex(budget.speculation.method.findData("off"))
    assert budget.plan.gpu_max == everything.device_bytes
    assert budget.plan.ram_max == budget.plan.facts.total_experts * budget.plan.facts.expert_bytes
