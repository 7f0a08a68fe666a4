"""Fixtures of the budget panel tests: gpt-oss-20b's real tensor table (no weights) and a panel shown
for a given machine."""

import pytest

from app.ui.budget import BudgetPanel
from app.ui.hardware import Machine
from tests.fixtures.shape_only import write_shape_only_model


@pytest.fixture(scope="module")
def gpt_oss_20b(tmp_path_factory):
    return str(write_shape_only_model(tmp_path_factory.mktemp("gpt-oss-20b")))


@pytest.fixture
def panel(qtbot):
    def make(machine: Machine, path: str) -> BudgetPanel:
        panel = BudgetPanel(lambda: machine)
        qtbot.addWidget(panel)
        panel.show()
        panel.show_model(path)
        return panel

    return make
