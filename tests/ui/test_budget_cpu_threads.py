"""The budget panel's CPU threads for experts on gpt-oss-20b's real tensor table: there beside a GPU, greyed where
they would compute nothing, the predicted speed with and without them, and the count going to the engine with the
plan and coming back with it after a restart. The planner (app.plan_gpus) is the oracle."""

import json
from dataclasses import replace

from PySide6.QtCore import Qt

from app.plan_cpu_tier import TIER_WORTH_IT
from app.plan_gpus import predict_gpus
from app.protocol.events import Loaded
from app.ui.budget import CPU_THREADS_TIP
from app.ui.budget_plan import STEPS
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow
from tests.ui.test_engine_client import INFO, StandInEngine

RTX_4090 = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4090", gpu_bytes=24 * GIB, pcie_gen=4, cores=16)
NO_GPU = Machine(ram_bytes=16 * GIB, cores=16)
MISSING_MOST = STEPS * 4 // 10  # of the 4090's slider: about a third of the experts in its slots


def offloaded(budget):
    budget.gpu_slider.setValue(MISSING_MOST)
    assert 0 < budget.plan.placement.expert_slots < budget.plan.facts.total_experts // 2
    return budget


def test_the_control_is_there_beside_a_gpu_up_to_every_core_but_one(panel, gpt_oss_20b):
    budget = panel(RTX_4090, gpt_oss_20b)
    assert budget.form.isRowVisible(budget.cpu_threads) and budget.cpu_threads.maximum() == 15
    assert budget.cpu_threads.value() == 0  # every expert on the GPU: nothing to gain
    without_gpu = panel(NO_GPU, gpt_oss_20b)
    assert not without_gpu.form.isRowVisible(without_gpu.cpu_threads) and without_gpu.plan.cpu_threads_max == 0
    one_core = offloaded(panel(replace(RTX_4090, cores=1), gpt_oss_20b))
    assert not one_core.cpu_threads.isEnabled() and "no core to spare" in one_core.cpu_threads.toolTip()


def test_until_chosen_the_threads_are_on_only_where_the_plan_predicts_them_worth_their_cores(panel, gpt_oss_20b):
    budget = panel(RTX_4090, gpt_oss_20b)
    plan = budget.plan
    budget.gpu_slider.setValue(STEPS * 8 // 10)  # most experts on the GPU: few misses to share
    assert plan.cpu_tier_idle is None and plan.cpu_threads == 0 and budget.cpu_threads.value() == 0
    with_every_core = predict_gpus(plan.facts, plan.placement, plan.gpus, 2, RTX_4090.hardware, cpu_threads=15)
    assert plan.prediction_without_tier.tok_s_low < with_every_core.tok_s_low < \
        TIER_WORTH_IT * plan.prediction_without_tier.tok_s_low
    offloaded(budget)
    assert plan.cpu_threads == 15 and budget.cpu_threads.value() == 15


def test_more_threads_change_the_predicted_speed_and_the_cpus_experts(panel, gpt_oss_20b, qtbot):
    budget = offloaded(panel(RTX_4090, gpt_oss_20b))
    plan = budget.plan
    assert budget.cpu_threads.isEnabled() and budget.cpu_threads.toolTip() == CPU_THREADS_TIP
    assert plan.cpu_threads == 15 and plan.load_request().cpu_threads == 15  # predicted faster: on until chosen
    assert plan.prediction.tok_s_low >= TIER_WORTH_IT * plan.prediction_without_tier.tok_s_low
    budget.cpu_threads.setValue(0)
    off = plan.prediction
    assert budget.cpu_threads.text() == "off" and plan.load_request().cpu_threads == 0
    assert "without the CPU threads" not in budget.speed.text() and "the CPU computes" not in budget.details.text()
    budget.cpu_threads.setFocus()
    for _ in range(12):
        qtbot.keyClick(budget.cpu_threads, Qt.Key.Key_Up)
    assert plan.cpu_threads == 12 and plan.load_request().cpu_threads == 12
    oracle = [plan.facts, plan.placement, plan.gpus, 2, RTX_4090.hardware]
    assert plan.prediction == predict_gpus(*oracle, cpu_threads=12) and plan.prediction_without_tier == off
    assert plan.prediction.tok_s_low > off.tok_s_low and plan.prediction.cpu_experts_per_token > 0
    assert f"({off.tok_s_low:.1f}–{off.tok_s_high:.1f} without the CPU threads)" in budget.speed.text()
    assert f"the CPU computes {plan.prediction.cpu_experts_per_token:.1f} experts per token" in budget.details.text()
    budget.cpu_threads.setValue(0)
    assert plan.prediction == off and "without the CPU threads" not in budget.speed.text()
    budget.gpu_slider.setValue(STEPS // 2)  # chosen, the count stays whatever the budgets
    assert plan.cpu_threads == 0


def test_where_the_threads_would_compute_nothing_they_are_greyed_and_say_why(panel, gpt_oss_20b):
    budget = panel(RTX_4090, gpt_oss_20b)
    budget.cpu_threads.setValue(8)  # before the plan lets them work: kept for when it does
    assert budget.plan.placement.expert_slots == budget.plan.facts.total_experts
    assert not budget.cpu_threads.isEnabled() and "every expert is on the GPU" in budget.cpu_threads.toolTip()
    offloaded(budget)
    assert budget.cpu_threads.isEnabled() and budget.plan.prediction.cpu_experts_per_token > 0
    budget.ram_slider.setValue(STEPS // 2)
    assert budget.plan.placement.disk_experts > 0 and not budget.cpu_threads.isEnabled()
    assert "Off here: some experts are read from disk" in budget.cpu_threads.toolTip()
    assert budget.plan.prediction == budget.plan.prediction_without_tier
    assert "without the CPU threads" not in budget.speed.text() and budget.cpu_threads.value() == 8


def test_the_engines_words_for_the_threads_are_the_panels():
    said = RTX_4090.in_words("--cpu-threads needs the CPU expert kernels …; use --cpu-threads 0")
    assert said == "the CPU expert tier needs the CPU expert kernels …; use 0 CPU threads for experts"


def test_the_threads_go_to_the_engine_with_the_plan_and_come_back_after_a_restart(qtbot, tmp_path, gpt_oss_20b):
    spawn = StandInEngine()
    window = MainWindow(tmp_path, machine=RTX_4090, spawn=spawn)
    qtbot.addWidget(window)
    assert window.library.add_folder(gpt_oss_20b)
    budget = offloaded(window.budget)
    budget.cpu_threads.setValue(7)
    qtbot.mouseClick(budget.load_button, Qt.MouseButton.LeftButton)
    request = spawn.spawned[0].requests.get(timeout=2)
    assert request == replace(budget.plan.load_request(), cpu_threads=7) and request.cpu_threads == 7
    with qtbot.waitSignal(window.client.loaded, timeout=2000):
        spawn.spawned[0].events.put(Loaded(replace(INFO, path=request.path)))
    assert json.loads((tmp_path / "settings.json").read_text())["last_load"]["cpu_threads"] == 7
    window.close()

    again = MainWindow(tmp_path, machine=RTX_4090, spawn=StandInEngine())
    qtbot.addWidget(again)
    qtbot.waitUntil(lambda: again.budget.plan.path == request.path)
    assert again.budget.plan.load_request() == request and again.budget.cpu_threads.value() == 7
    again.close()
