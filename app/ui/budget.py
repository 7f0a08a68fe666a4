"""The budget panel: GPU and RAM sliders bounded by this machine and the model, the CPU threads that compute
experts beside a GPU, the placement they give and the predicted decode speed, recomputed while a slider moves
(no engine involved). The planning itself is `BudgetPlan`'s; this is its widget."""

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QPushButton, QSlider, QSpinBox, QVBoxLayout, QWidget

from app.errors import UserError
from app.protocol.requests import LoadModel
from app.sizes import format_size
from app.ui.budget_plan import STEPS, Budget, BudgetPlan
from app.ui.hardware import Machine
from app.ui.placement_bar import PlacementBar
from app.ui.speculation import SpeculationPanel

RAM_NAME = "RAM budget"
CPU_RAM_NAME = "RAM expert store"  # without a GPU both budgets are RAM: this one is the experts' store
CPU_THREADS_NAME = "CPU threads for experts"
CPU_THREADS_TIP = ("Cores that compute part of the experts the GPU misses while it fetches the others (0: off). "
                   "They take a share only where that is quicker than fetching; while the model answers they keep "
                   "those cores busy.")


def _speed(tok_s: float) -> str:
    return f"{tok_s:.0f}" if tok_s >= 100 else f"{tok_s:.1f}"


class BudgetPanel(QWidget):
    """Shows `plan` (a BudgetPlan) and lets the user change it. Signals: load_requested(request: LoadModel),
    the plan on screen as the engine's load request."""

    load_requested = Signal(object)

    def __init__(self, machine: Callable[[], Machine], parent: QWidget | None = None):
        super().__init__(parent)
        self.plan = BudgetPlan(machine)
        self.more_gpu_sliders: list[QSlider] = []  # GPU 1, 2, ...: their experts' share (0: left out)
        self.more_gpu_labels: list[QLabel] = []

        self.title = QLabel("Pick a model in the library to plan its memory.")
        self.title.setWordWrap(True)
        self.machine_label = QLabel()
        self.machine_label.setProperty("role", "muted")
        self.gpu_slider = self._slider(self.plan.gpu)
        self.ram_slider = self._slider(self.plan.ram)
        self.gpu_label, self.ram_label = QLabel("GPU budget"), QLabel(RAM_NAME)
        self.cpu_threads = QSpinBox()
        self.cpu_threads.setSpecialValueText("off")
        self.cpu_threads.valueChanged.connect(self._choose_cpu_threads)
        self.context = QComboBox()
        self.context.currentIndexChanged.connect(lambda _index: self._choose_context())
        self.bar = PlacementBar()
        self.speed = QLabel()
        self.speed.setProperty("role", "headline")
        self.details = QLabel()
        self.details.setWordWrap(True)
        self.refusal = QLabel()
        self.refusal.setWordWrap(True)
        self.refusal.setProperty("role", "error")
        self.warning = QLabel()
        self.warning.setWordWrap(True)
        self.warning.setProperty("role", "warning")
        self.speculation = SpeculationPanel()
        self.speculation.method_changed.connect(lambda _method: self._choose_speculation())
        self.load_button = QPushButton("Load with this plan")
        self.load_button.clicked.connect(self.request_load)

        self.form = form = QFormLayout()
        form.addRow(self.gpu_label, self.gpu_slider)
        form.addRow(self.ram_label, self.ram_slider)
        form.addRow(CPU_THREADS_NAME, self.cpu_threads)
        form.setRowVisible(self.cpu_threads, False)  # until a machine with a GPU is known
        form.addRow("Context", self.context)
        layout = QVBoxLayout(self)
        for widget in (self.title, self.machine_label):
            layout.addWidget(widget)
        layout.addLayout(form)
        for widget in (self.bar, self.speed, self.details, self.refusal, self.warning, self.speculation,
                       self.load_button):
            layout.addWidget(widget)
        layout.addStretch()
        self._set_enabled(False)

    def _slider(self, budget: Budget) -> QSlider:
        slider = QSlider(Qt.Orientation.Horizontal)
        slider.setRange(0, STEPS)
        slider.setPageStep(STEPS // 20)
        slider.valueChanged.connect(lambda value: self._moved(budget, value))
        return slider

    def _moved(self, budget: Budget, position: int) -> None:
        self.plan.move(budget, position)
        self._show()

    def show_model(self, path: str | None) -> None:
        """Plan for the model folder at `path` (None: no model)."""
        first_model = self.plan.machine is None
        try:
            self.plan.open(path)
        except UserError as error:
            self.title.setText(f"Cannot plan {path}: {error}")
        facts = self.plan.facts
        self.speculation.blockSignals(True)  # its method may change here: the plan asks for it below
        self.speculation.show_model(facts.model_type if facts else None, path)
        self.speculation.blockSignals(False)
        if facts is None:
            self._set_enabled(False)
            self._show()
            return
        machine = self.plan.machine
        if first_model:
            self.machine_label.setText(machine.describe())
            self.speculation.note.setText(machine.in_words(self.speculation.note.text()))
            self._add_gpu_sliders()
            self.form.setRowVisible(self.cpu_threads, bool(machine.gpu_bytes))
        self.title.setText(f"<b>{self.plan.folder.path.name}</b> · {facts.model_type} · "
                           f"{facts.total_experts} routed experts of {format_size(facts.expert_bytes)}")
        self.plan.start(self.speculation.options()["spec"] != "off")
        self._fill_contexts()
        self._set_enabled(True)
        self._show()

    def show_plan(self, request: LoadModel) -> None:
        """Put a remembered load request on screen: its model, context, speculation and exact budgets (the
        sliders as near as their steps go); a budget beyond this machine is cut to its slider's end."""
        if request.path != self.plan.path:
            self.show_model(request.path)
        if self.plan.facts is None:
            return
        self.context.setCurrentIndex(max(self.context.findData(request.context), 0))
        self.speculation.set_options(request.spec, request.drafter, request.block_size)
        self.plan.place(request)
        self._show()

    def request_load(self) -> None:
        self.load_requested.emit(self.plan.load_request(**self.speculation.options()))

    def _choose_context(self) -> None:
        if self.plan.facts is not None:
            self.plan.choose_context(self.context.currentData())
            self._show()

    def _choose_cpu_threads(self, threads: int) -> None:
        self.plan.choose_cpu_threads(threads)
        self._show()

    def _choose_speculation(self) -> None:
        self.plan.choose_speculation(self.speculation.options()["spec"] != "off")
        self._show()

    def _add_gpu_sliders(self) -> None:
        for index, budget in enumerate(self.plan.more_gpus, start=1):
            slider, label = self._slider(budget), QLabel()
            self.form.insertRow(index, label, slider)
            self.more_gpu_sliders.append(slider)
            self.more_gpu_labels.append(label)

    def _fill_contexts(self) -> None:
        self.context.blockSignals(True)
        self.context.clear()
        for tokens in self.plan.contexts:
            self.context.addItem(f"{tokens} tokens", tokens)
        self.context.setCurrentIndex(max(self.context.findData(self.plan.context), 0))
        self.context.blockSignals(False)

    @property
    def device_name(self) -> str:
        """The device row's name: the GPU, or without one the memory the model runs in."""
        return "GPU" if self.plan.machine.gpu_bytes else "Memory"

    def _set_enabled(self, enabled: bool) -> None:
        for widget in (self.gpu_slider, *self.more_gpu_sliders, self.ram_slider, self.context, self.load_button):
            widget.setEnabled(enabled)

    def _show(self) -> None:
        """The plan on screen: the sliders where its budgets are, their labels, and what they give."""
        plan = self.plan
        for slider, budget in zip([self.gpu_slider, *self.more_gpu_sliders, self.ram_slider], plan.budgets,
                                  strict=True):
            slider.blockSignals(True)
            slider.setValue(budget.position)
            slider.blockSignals(False)
        if plan.facts is not None:
            first = "GPU 0 budget" if self.more_gpu_sliders else plan.machine.budget_name
            self.gpu_label.setText(f"{first} {format_size(plan.gpu_budget)}")
            for index, (label, budget) in enumerate(zip(self.more_gpu_labels, plan.more_gpus, strict=True), start=1):
                label.setText(f"GPU {index} budget {format_size(budget.bytes) if budget.bytes else 'off'}")
            self.ram_label.setText(f"{RAM_NAME if plan.machine.gpu_bytes else CPU_RAM_NAME} "
                                   f"{format_size(plan.ram_budget)}")
        self._show_cpu_threads()
        self.refusal.setText(f"This plan cannot run: {plan.refusal}" if plan.refusal else "")
        if plan.placement is not None:
            self._show_placement()
        for widget in (self.bar, self.speed, self.details):
            widget.setVisible(plan.placement is not None)
        self.refusal.setVisible(bool(self.refusal.text()))
        if plan.exceeds_ram:
            self.warning.setText(
                f"The memory budget and the {CPU_RAM_NAME} together ({format_size(plan.placement.device_bytes)} "
                f"+ {format_size(plan.placement.host_bytes)}) exceed this machine's "
                f"{format_size(plan.machine.ram_bytes)} of RAM: lower one of them, or load anyway and expect "
                "swapping or an out-of-memory kill."
            )
        self.warning.setVisible(plan.exceeds_ram)
        self.load_button.setEnabled(plan.placement is not None)

    def _show_cpu_threads(self) -> None:
        """At the plan's count, up to the plan's most; greyed, saying why, where they would compute nothing."""
        plan, threads = self.plan, self.cpu_threads
        threads.blockSignals(True)
        threads.setRange(0, plan.cpu_threads_max)
        threads.setValue(plan.cpu_threads)
        threads.blockSignals(False)
        idle = "this machine has no core to spare" if not plan.cpu_threads_max else plan.cpu_tier_idle
        threads.setEnabled(plan.facts is not None and idle is None)
        threads.setToolTip(f"Off here: {idle}." if idle else CPU_THREADS_TIP)

    def _show_placement(self) -> None:
        plan = self.plan
        p, placement = plan.prediction, plan.placement
        where = "on the GPU" if plan.machine.gpu_bytes else "in the memory budget"
        if plan.gpus:
            self.bar.show_gpus(plan.gpus, plan.gpu_budgets, [plan.gpu_max, *plan.more_gpu_max][: len(plan.gpus)])
            where = f"on {len(plan.gpus)} GPUs ({' + '.join(str(gpu.expert_slots) for gpu in plan.gpus)})"
        else:
            self.bar.show_placement(placement, self.device_name, plan.gpu_budget, plan.gpu_max)
        speed = f"Predicted decode: {_speed(p.tok_s_low)}–{_speed(p.tok_s_high)} tok/s"
        tier = ""
        if plan.cpu_threads and plan.cpu_tier_idle is None:
            without = plan.prediction_without_tier
            speed += f" ({_speed(without.tok_s_low)}–{_speed(without.tok_s_high)} without the CPU threads)"
            tier = f" · the CPU computes {p.cpu_experts_per_token:.1f} experts per token"
        self.speed.setText(speed)
        self.details.setText(
            f"{placement.expert_slots} of {plan.facts.total_experts} experts {where}"
            f" · cache hit rate {p.hit_rate:.0%} "
            f"({'as measured on real text' if p.measured_routing else 'uniform routing, the worst case'})"
            f" · {format_size(p.fetched_bytes_per_token)} fetched per token{tier} · limited by {p.bound}"
            f" · {placement.disk_experts} experts read from disk"
        )
