"""The budget panel's planning without a widget, on gpt-oss-20b's real tensor table: the planner
(app.plan, app.plan_gpus) is the oracle for every budget the plan stands for."""

from dataclasses import replace

import pytest

from app.errors import UserError
from app.model_folder import ModelFolder
from app.plan import ModelFacts, plan_placement
from app.plan_gpus import plan_budgets, predict_gpus
from app.protocol.requests import LoadModel
from app.ui.budget_plan import STEPS, BudgetPlan
from app.ui.hardware import GIB, Machine

RTX_4090 = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4090", gpu_bytes=24 * GIB, pcie_gen=4)
SMALL_GPU = Machine(ram_bytes=8 * GIB, gpu_name="NVIDIA GeForce RTX 4060", gpu_bytes=8 * GIB, pcie_gen=4)
TWO_GPUS = replace(SMALL_GPU, ram_bytes=64 * GIB, more_gpu_bytes=(8 * GIB,))
NO_GPU = Machine(ram_bytes=16 * GIB)


def started(machine: Machine, path: str, speculates: bool = False) -> BudgetPlan:
    plan = BudgetPlan(lambda: machine)
    plan.open(path)
    plan.start(speculates)
    return plan


def test_a_new_model_starts_within_the_machines_shares_and_plans_as_the_planner_does(gpt_oss_20b):
    plan = started(SMALL_GPU, gpt_oss_20b)
    facts = replace(ModelFacts.from_folder(ModelFolder.open(gpt_oss_20b)), fp8_kept=True)
    assert plan.machine is SMALL_GPU and plan.facts == facts and plan.context == 4096
    assert plan.gpu_max == 8 * GIB and plan.gpu_budget == pytest.approx(0.9 * 8 * GIB, rel=0.002)
    assert plan.ram_max == 8 * GIB and plan.ram_budget == pytest.approx(0.75 * 8 * GIB, rel=0.002)
    placement, gpus = plan_budgets(facts, plan.gpu_budget, plan.ram_budget, 4096, 2)
    assert (plan.placement, plan.gpus) == (placement, gpus) and plan.refusal is None
    assert plan.prediction == predict_gpus(facts, placement, gpus, 2, SMALL_GPU.hardware)


def test_the_device_budget_ends_where_everything_fits_twice_that_with_speculation(gpt_oss_20b):
    plan = started(RTX_4090, gpt_oss_20b)
    everything = plan_placement(plan.facts, None, None, 4096, 2).device_bytes
    assert plan.gpu_max == everything < 24 * GIB
    plan.choose_speculation(True)
    assert plan.gpu_max == min(2 * everything, 24 * GIB)
    plan.choose_speculation(False)
    plan.choose_context(16384)
    assert plan.gpu_max == plan_placement(plan.facts, None, None, 16384, 2).device_bytes > everything
    assert plan.placement.context == 16384


def test_a_remembered_request_comes_back_exactly_until_its_slider_moves(gpt_oss_20b):
    plan = started(TWO_GPUS, gpt_oss_20b)
    request = LoadModel(gpt_oss_20b, device="cuda", dtype="bfloat16", gpu_budget=(5 * GIB + 12345, GIB + 7),
                        ram_budget=3 * GIB + 1, context=4096, max_batch=1)
    plan.place(request)
    assert plan.load_request() == request  # the exact bytes, not the sliders' steps
    assert plan.gpus == plan_budgets(plan.facts, request.gpu_budget, request.ram_budget, 4096, 2)[1]
    plan.move(plan.gpu, 500)
    assert plan.gpu_budgets == (plan.gpu_max * 500 // STEPS, GIB + 7)
    plan.move(plan.more_gpus[0], 0)  # GPU 1 off: the first GPU alone
    assert plan.gpu_budgets == plan.gpu_max * 500 // STEPS and plan.gpus == ()


def test_a_budget_beyond_the_machine_is_cut_to_its_end(gpt_oss_20b):
    plan = started(SMALL_GPU, gpt_oss_20b)
    plan.place(LoadModel(gpt_oss_20b, gpu_budget=80 * GIB, ram_budget=None))
    assert plan.gpu.position == STEPS and plan.gpu_budget == plan.gpu_max == 8 * GIB
    assert plan.ram_budget == pytest.approx(0.75 * 8 * GIB, rel=0.002)  # not given: it stays


def test_an_impossible_budget_is_refused_in_the_machines_words(gpt_oss_20b):
    plan = started(NO_GPU, gpt_oss_20b)
    assert plan.placement.device_bytes + plan.placement.host_bytes <= 0.9 * 16 * GIB and not plan.exceeds_ram
    plan.move(plan.ram, STEPS)
    assert plan.exceeds_ram and plan.placement is not None  # both budgets are RAM here: still a plan
    plan.move(plan.gpu, STEPS // 100)
    assert plan.placement is None and plan.prediction is None
    assert plan.refusal.startswith("memory budget") and "GPU" not in plan.refusal


def test_a_folder_that_is_not_a_model_is_said_and_plans_nothing(gpt_oss_20b, tmp_path):
    plan = started(RTX_4090, gpt_oss_20b)
    with pytest.raises(UserError, match=r"config\.json is missing"):
        plan.open(str(tmp_path))
    assert plan.facts is None and plan.placement is None and plan.path == str(tmp_path)
