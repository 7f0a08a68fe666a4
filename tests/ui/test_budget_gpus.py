"""The budget panel on a machine with two GPUs: a slider per GPU, the expert-parallel plan they give,
the bar per GPU, and the load request carrying a budget per GPU."""

import subprocess

from PySide6.QtCore import Qt

from app.model_folder import ModelFolder
from app.plan import ModelFacts
from app.plan_gpus import expert_workspace, plan_gpus
from app.ui.budget_plan import STEPS
from app.ui.hardware import GIB, Machine, detect_machine

TWO_SMALL = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4060 Ti", gpu_bytes=8 * GIB, pcie_gen=4,
                    more_gpu_bytes=(8 * GIB,))
TWO_LARGE = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4090", gpu_bytes=24 * GIB, pcie_gen=4,
                    more_gpu_bytes=(24 * GIB,))


def test_a_second_gpu_gets_its_slider_and_the_plan_spreads_the_experts(panel, gpt_oss_20b):
    budget = panel(TWO_SMALL, gpt_oss_20b)
    facts = ModelFacts.from_folder(ModelFolder.open(gpt_oss_20b))
    assert len(budget.more_gpu_sliders) == 1 and budget.gpu_label.text().startswith("GPU 0 budget")
    assert budget.more_gpu_labels[0].text() == "GPU 1 budget off"  # further GPUs start off
    budget.more_gpu_sliders[0].setValue(STEPS * 9 // 10)
    assert budget.more_gpu_labels[0].text().startswith("GPU 1 budget 7.")
    budgets = budget.plan.gpu_budgets
    assert budgets == (budget.plan.gpu_budget, budget.plan.more_gpu_max[0] * 9 // 10)
    assert budget.plan.gpus == plan_gpus(facts, budgets, budget.plan.ram_budget, 4096, 2)
    assert budget.plan.placement.expert_slots == sum(gpu.expert_slots for gpu in budget.plan.gpus)
    assert [label for label, _, _ in budget.bar.rows] == ["GPU 0", "GPU 1", "RAM / disk"]
    assert "on 2 GPUs" in budget.details.text()
    two_gpus = budget.plan.prediction
    budget.more_gpu_sliders[0].setValue(0)  # GPU 1 off: the first GPU alone
    assert budget.plan.gpus == () and budget.plan.gpu_budgets == budget.plan.gpu_budget
    assert budget.more_gpu_labels[0].text() == "GPU 1 budget off"
    assert [label for label, _, _ in budget.bar.rows] == ["GPU", "RAM / disk"]
    assert budget.plan.prediction.hit_rate < two_gpus.hit_rate and budget.plan.prediction.tok_s_low < two_gpus.tok_s_low


def test_moving_the_second_gpus_slider_moves_its_share(panel, gpt_oss_20b, qtbot):
    budget = panel(TWO_SMALL, gpt_oss_20b)
    budget.more_gpu_sliders[0].setValue(STEPS * 7 // 10)  # below where GPU 1 would hold all the rest
    seen = []
    for _ in range(4):
        qtbot.keyClick(budget.more_gpu_sliders[0], Qt.Key.Key_PageDown)
        plan = budget.plan
        seen.append((plan.gpus[0].expert_slots, plan.gpus[1].expert_slots, plan.prediction.tok_s_low))
    first, second, speeds = zip(*seen, strict=True)
    assert len(set(first)) == 1  # the first GPU's share stays
    assert list(second) == sorted(second, reverse=True) and len(set(second)) == 4
    assert list(speeds) == sorted(speeds, reverse=True)


def test_the_load_request_carries_a_budget_per_gpu(panel, gpt_oss_20b, qtbot):
    budget = panel(TWO_SMALL, gpt_oss_20b)
    budget.more_gpu_sliders[0].setValue(STEPS // 2)
    with qtbot.waitSignal(budget.load_requested) as requested:
        qtbot.mouseClick(budget.load_button, Qt.MouseButton.LeftButton)
    plan = budget.plan
    assert requested.args[0].gpu_budget == plan.gpu_budgets == (plan.gpu_budget, plan.more_gpu_max[0] // 2)


def test_a_second_gpus_slider_ends_where_every_expert_fits_on_it(panel, gpt_oss_20b):
    budget = panel(TWO_LARGE, gpt_oss_20b)
    assert budget.plan.gpus == () and isinstance(budget.plan.gpu_budgets, int)
    facts = budget.plan.facts
    assert budget.plan.more_gpu_max[0] == expert_workspace(facts, 4096, 2) + facts.total_experts * facts.expert_bytes
    budget.more_gpu_sliders[0].setValue(STEPS)
    assert [gpu.expert_slots for gpu in budget.plan.gpus] == [facts.total_experts // 2] * 2  # spread evenly


def test_every_gpu_nvidia_smi_lists_is_found():
    def smi(args, **_):
        return subprocess.CompletedProcess(args, 0, "NVIDIA GeForce RTX 4090, 24564, 4\nNVIDIA GeForce RTX 3090, "
                                                    "24576, 4\n", "")

    machine = detect_machine(run=smi)
    assert machine.gpu_name == "NVIDIA GeForce RTX 4090" and machine.more_gpu_bytes == (24576 << 20,)
    assert machine.gpus_bytes == (24564 << 20, 24576 << 20)
    assert "+ GPU 1 (24 GiB)" in machine.describe()
