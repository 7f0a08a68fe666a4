"""The budget panel: GPU and RAM sliders bounded by this machine and the model, the placement they
give and the predicted decode speed, recomputed while a slider moves (no engine involved)."""

from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QPushButton, QSlider, QVBoxLayout, QWidget

from app.errors import UserError
from app.model_folder import ModelFolder
from app.plan import ModelFacts, Placement, Prediction, dtype_bytes, plan_placement
from app.plan_gpus import expert_workspace, plan_budgets, predict_gpus
from app.protocol.requests import LoadModel
from app.sizes import format_size
from app.ui.hardware import Machine
from app.ui.placement_bar import PlacementBar
from app.ui.speculation import SpeculationPanel

STEPS = 1000
RAM_NAME = "RAM budget"
CPU_RAM_NAME = "RAM expert store"  # without a GPU both budgets are RAM: this one is the experts' store
CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_CONTEXT = 4096
DEFAULT_GPU_SHARE = 0.9  # of the device's memory: the desktop and the CUDA context need some
DEFAULT_RAM_SHARE = 0.75  # of the machine's RAM, when the experts do not fit in less
# With speculation the device slider ends at this many times the target's whole plan: a drafter (DFlash, or
# GLM's MTP layer) with its cache is smaller than its target, so the pair fits below it
SPECULATION_ROOM = 2


def _speed(tok_s: float) -> str:
    return f"{tok_s:.0f}" if tok_s >= 100 else f"{tok_s:.1f}"


class BudgetPanel(QWidget):
    """Signals: load_requested(request: LoadModel), the plan on screen as the engine's load request."""

    load_requested = Signal(object)

    def __init__(self, machine: Callable[[], Machine], parent: QWidget | None = None):
        super().__init__(parent)
        self._machine_source = machine
        self.machine: Machine | None = None
        self.path: str | None = None
        self.facts: ModelFacts | None = None
        self.placement: Placement | None = None
        self.gpus: tuple[Placement, ...] = ()  # one per GPU while the experts spread over several
        self.prediction: Prediction | None = None
        self.gpu_max = self.ram_max = 0
        self.more_gpu_sliders: list[QSlider] = []  # GPU 1, 2, ...: their experts' share (0: left out)
        self.more_gpu_labels: list[QLabel] = []
        self.more_gpu_max: list[int] = []
        self._pinned: dict[QSlider, int] = {}  # exact budgets of a remembered plan, until their slider moves

        self.title = QLabel("Pick a model in the library to plan its memory.")
        self.title.setWordWrap(True)
        self.machine_label = QLabel()
        self.machine_label.setProperty("role", "muted")
        self.gpu_slider = self._slider()
        self.ram_slider = self._slider()
        self.gpu_label, self.ram_label = QLabel("GPU budget"), QLabel(RAM_NAME)
        self.context = QComboBox()
        self.context.currentIndexChanged.connect(self._bound_sliders)
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
        self.speculation.method_changed.connect(self._bound_sliders)
        self.load_button = QPushButton("Load with this plan")
        self.load_button.clicked.connect(self.request_load)

        self.form = form = QFormLayout()
        form.addRow(self.gpu_label, self.gpu_slider)
        form.addRow(self.ram_label, self.ram_slider)
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

    def _slider(self) -> QSlider:
        slider = QSlider(Qt.Orientation.Horizontal)
        slider.setRange(0, STEPS)
        slider.setPageStep(STEPS // 20)
        slider.valueChanged.connect(lambda _value: self._moved(slider))
        return slider

    def _moved(self, slider: QSlider) -> None:
        self._pinned.pop(slider, None)
        self._replan()

    def _budget(self, slider: QSlider, top: int) -> int:
        return self._pinned.get(slider, top * slider.value() // STEPS)

    @property
    def gpu_budget(self) -> int:
        return self._budget(self.gpu_slider, self.gpu_max)

    @property
    def ram_budget(self) -> int:
        return self._budget(self.ram_slider, self.ram_max)

    @property
    def gpu_budgets(self) -> int | tuple[int, ...]:
        """The first GPU's budget, or one per GPU up to the last whose slider is above 0 (the load request's)."""
        budgets = [self.gpu_budget, *(self._budget(slider, top)
                                      for top, slider in zip(self.more_gpu_max, self.more_gpu_sliders, strict=True))]
        while len(budgets) > 1 and budgets[-1] == 0:
            budgets.pop()
        return tuple(budgets) if len(budgets) > 1 else budgets[0]

    def show_model(self, path: str | None) -> None:
        """Plan for the model folder at `path` (None: no model)."""
        self.path, self.facts = path, None
        self._pinned.clear()
        if path is not None:
            try:
                folder = ModelFolder.open(path)
                self.facts = ModelFacts.from_folder(folder)
            except UserError as error:
                self.title.setText(f"Cannot plan {path}: {error}")
        self.speculation.blockSignals(True)  # its method may change here: the sliders are bounded below
        self.speculation.show_model(self.facts.model_type if self.facts else None, path)
        self.speculation.blockSignals(False)
        if self.facts is None:
            self._set_enabled(False)
            self._replan()
            return
        if self.machine is None:
            self.machine = self._machine_source()
            self.machine_label.setText(self.machine.describe())
            self.speculation.note.setText(self.machine.in_words(self.speculation.note.text()))
            self._add_gpu_sliders()
        self.facts = replace(self.facts, fp8_kept=self.machine.device == "cuda")  # as the engine will hold them
        self.title.setText(f"<b>{folder.path.name}</b> · {self.facts.model_type} · "
                           f"{self.facts.total_experts} routed experts of {format_size(self.facts.expert_bytes)}")
        self._fill_contexts(folder.config.get("max_position_embeddings", CONTEXTS[-1]))
        all_experts = self.facts.total_experts * self.facts.expert_bytes
        self.ram_max = min(self.machine.ram_bytes, all_experts)
        ram_default = min(all_experts, int(DEFAULT_RAM_SHARE * self.machine.ram_bytes))
        self._set_enabled(True)
        self._bound_sliders()
        gpu_default = min(self.gpu_max, int(DEFAULT_GPU_SHARE * self.machine.device_bytes))
        # further GPUs start off: on the H200 pair, two GPUs decoded slower than one (bench/NOTES.md)
        for slider in self.more_gpu_sliders:
            slider.setValue(0)
        self.gpu_slider.setValue(STEPS * gpu_default // max(self.gpu_max, 1))
        if not self.machine.gpu_bytes:  # on the CPU both budgets are RAM: together they start within its share
            ram_default = min(ram_default, max(int(DEFAULT_GPU_SHARE * self.machine.ram_bytes) - self.gpu_budget, 0))
        self.ram_slider.setValue(STEPS * ram_default // max(self.ram_max, 1))
        self._replan()

    def show_plan(self, request: LoadModel) -> None:
        """Put a remembered load request on screen: its model, context, speculation and exact budgets (the
        sliders as near as their steps go); a budget beyond this machine is cut to its slider's end."""
        if request.path != self.path:
            self.show_model(request.path)
        if self.facts is None:
            return
        self.context.setCurrentIndex(max(self.context.findData(request.context), 0))
        self.speculation.set_options(request.spec, request.drafter, request.block_size)
        gpu_budgets = request.gpu_budget if isinstance(request.gpu_budget, tuple) else (request.gpu_budget,)
        sliders = [(self.gpu_slider, self.gpu_max), *zip(self.more_gpu_sliders, self.more_gpu_max, strict=True),
                   (self.ram_slider, self.ram_max)]
        budgets = [*gpu_budgets[: len(sliders) - 1], *[0] * (len(sliders) - 1 - len(gpu_budgets)), request.ram_budget]
        for (slider, top), budget in zip(sliders, budgets, strict=True):
            if budget is None:
                continue
            slider.setValue(STEPS * min(budget, top) // max(top, 1))
            if budget <= top:
                self._pinned[slider] = budget
        self._replan()

    def _add_gpu_sliders(self) -> None:
        for index in range(1, len(self.machine.gpus_bytes)):
            slider, label = self._slider(), QLabel()
            self.form.insertRow(index, label, slider)
            self.more_gpu_sliders.append(slider)
            self.more_gpu_labels.append(label)
            self.more_gpu_max.append(0)

    def _bound_sliders(self) -> None:
        """The GPU slider ends where the machine ends or where everything fits (for this context); with
        speculation, where the machine ends (the drafter's bytes come out of the budget)."""
        if self.facts is not None:
            everything = plan_placement(self.facts, None, None, self.context.currentData(), self._dtype_bytes)
            speculates = self.speculation.options()["spec"] != "off"
            whole = everything.device_bytes * (SPECULATION_ROOM if speculates else 1)
            self.gpu_max = min(self.machine.device_bytes, whole)
            # a further GPU holds its slots and the experts' workspace; beyond every expert nothing is gained
            experts = expert_workspace(self.facts, self.context.currentData(), self._dtype_bytes) + \
                self.facts.total_experts * self.facts.expert_bytes
            self.more_gpu_max = [min(size, experts) for size in self.machine.more_gpu_bytes]
        self._replan()

    def _fill_contexts(self, longest: int) -> None:
        self.context.blockSignals(True)
        self.context.clear()
        for tokens in (c for c in CONTEXTS if c <= longest):
            self.context.addItem(f"{tokens} tokens", tokens)
        self.context.setCurrentIndex(max(self.context.findData(DEFAULT_CONTEXT), 0))
        self.context.blockSignals(False)

    @property
    def device_name(self) -> str:
        """The device row's name: the GPU, or without one the memory the model runs in."""
        return "GPU" if self.machine.gpu_bytes else "Memory"

    @property
    def _dtype_bytes(self) -> int:
        return dtype_bytes(self.machine.dtype)

    def _set_enabled(self, enabled: bool) -> None:
        for widget in (self.gpu_slider, *self.more_gpu_sliders, self.ram_slider, self.context, self.load_button):
            widget.setEnabled(enabled)

    def _replan(self) -> None:
        self.placement, self.gpus, self.prediction = None, (), None
        self.refusal.clear()
        if self.facts is not None and self.machine is not None:
            first = "GPU 0 budget" if self.more_gpu_sliders else self.machine.budget_name
            self.gpu_label.setText(f"{first} {format_size(self.gpu_budget)}")
            for index, (label, top, slider) in enumerate(zip(self.more_gpu_labels, self.more_gpu_max,
                                                             self.more_gpu_sliders, strict=True), start=1):
                budget = self._budget(slider, top)
                label.setText(f"GPU {index} budget {format_size(budget) if budget else 'off'}")
            self.ram_label.setText(f"{RAM_NAME if self.machine.gpu_bytes else CPU_RAM_NAME} "
                                   f"{format_size(self.ram_budget)}")
            try:
                self.placement, self.gpus = plan_budgets(self.facts, self.gpu_budgets, self.ram_budget,
                                                         self.context.currentData(), self._dtype_bytes)
            except UserError as error:
                self.refusal.setText(f"This plan cannot run: {self.machine.in_words(str(error))}")
        if self.placement is not None:
            self.prediction = predict_gpus(self.facts, self.placement, self.gpus, self._dtype_bytes,
                                           self.machine.hardware)
            self._show_plan()
        for widget in (self.bar, self.speed, self.details):
            widget.setVisible(self.placement is not None)
        self.refusal.setVisible(bool(self.refusal.text()))
        self.warning.setVisible(self.placement is not None and self._shares_ram())
        self.load_button.setEnabled(self.placement is not None)

    def _shares_ram(self) -> bool:
        """Without a GPU the device budget is RAM too: both budgets together may not fit."""
        if self.machine.gpu_bytes or self.placement.device_bytes + self.placement.host_bytes <= self.machine.ram_bytes:
            return False
        self.warning.setText(
            f"The memory budget and the {CPU_RAM_NAME} together ({format_size(self.placement.device_bytes)} "
            f"+ {format_size(self.placement.host_bytes)}) exceed this machine's {format_size(self.machine.ram_bytes)} "
            "of RAM: lower one of them, or load anyway and expect swapping or an out-of-memory kill."
        )
        return True

    def _show_plan(self) -> None:
        p, placement = self.prediction, self.placement
        where = "on the GPU" if self.machine.gpu_bytes else "in the memory budget"
        if self.gpus:
            self.bar.show_gpus(self.gpus, self.gpu_budgets, [self.gpu_max, *self.more_gpu_max][: len(self.gpus)])
            where = f"on {len(self.gpus)} GPUs ({' + '.join(str(gpu.expert_slots) for gpu in self.gpus)})"
        else:
            self.bar.show_placement(placement, self.device_name, self.gpu_budget, self.gpu_max)
        self.speed.setText(f"Predicted decode: {_speed(p.tok_s_low)}–{_speed(p.tok_s_high)} tok/s")
        self.details.setText(
            f"{placement.expert_slots} of {self.facts.total_experts} experts {where}"
            f" · cache hit rate {p.hit_rate:.0%} "
            f"({'as measured on real text' if p.measured_routing else 'uniform routing, the worst case'})"
            f" · {format_size(p.fetched_bytes_per_token)} fetched per token · limited by {p.bound}"
            f" · {placement.disk_experts} experts read from disk"
        )

    def request_load(self) -> None:
        self.load_requested.emit(LoadModel(
            self.path, device=self.machine.device, dtype=self.machine.dtype, gpu_budget=self.gpu_budgets,
            ram_budget=self.ram_budget, context=self.context.currentData(), **self.speculation.options(),
        ))
