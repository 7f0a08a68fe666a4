"""The budget panel's planning, without its widgets: the budgets its sliders stand for and the bounds they
move within, the placement and predicted speed those budgets give, and the load request they make. No Qt."""

from collections.abc import Callable
from dataclasses import dataclass, replace

from app.errors import UserError
from app.model_folder import ModelFolder
from app.plan import ModelFacts, Placement, Prediction, dtype_bytes, plan_placement
from app.plan_cpu_tier import cpu_tier_idle, tier_worth_it
from app.plan_gpus import expert_workspace, plan_budgets, predict_gpus
from app.protocol.requests import LoadModel
from app.ui.hardware import Machine

STEPS = 1000  # a slider's positions
CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_CONTEXT = 4096
DEFAULT_GPU_SHARE = 0.9  # of the device's memory: the desktop and the CUDA context need some
DEFAULT_RAM_SHARE = 0.75  # of the machine's RAM, when the experts do not fit in less
# With speculation the device slider ends at this many times the target's whole plan: a drafter (DFlash, or
# GLM's MTP layer) with its cache is smaller than its target, so the pair fits below it
SPECULATION_ROOM = 2


@dataclass
class Budget:
    """One budget as its slider shows it: `position` of STEPS along 0 … `top` bytes, or the exact bytes of a
    remembered plan (`pinned`) until the slider moves."""

    top: int = 0
    position: int = 0
    pinned: int | None = None

    @property
    def bytes(self) -> int:
        return self.pinned if self.pinned is not None else self.top * self.position // STEPS

    def move(self, position: int) -> None:
        self.position, self.pinned = max(0, min(position, STEPS)), None

    def place(self, budget: int) -> None:
        """Stand for `budget` bytes exactly, the slider as near as its steps go; one beyond `top` is cut to it."""
        self.move(STEPS * min(budget, self.top) // max(self.top, 1))
        if budget <= self.top:
            self.pinned = budget


class BudgetPlan:
    """The plan for one model folder on this machine (asked of `machine` when the first model is opened):
    a budget for the device (the first GPU, or RAM without one), one for each further GPU (0: left out)
    and one for the host's expert store, with the context, whether the load speculates and how many cores
    compute experts beside the GPU (`cpu_threads`: the count chosen, kept from model to model, or until one is
    chosen every core but one wherever the plan predicts them faster, else none). `placement`, `gpus`,
    `prediction` and `prediction_without_tier` (no CPU threads) follow every change; `refusal` says why the
    budgets cannot run, if they cannot."""

    def __init__(self, machine: Callable[[], Machine]):
        self._machine_source = machine
        self.machine: Machine | None = None
        self.path: str | None = None
        self.folder: ModelFolder | None = None
        self.facts: ModelFacts | None = None
        self.context: int | None = DEFAULT_CONTEXT
        self.speculates = False
        self.gpu, self.ram = Budget(), Budget()
        self.more_gpus: list[Budget] = []  # GPU 1, 2, …: their experts' share
        self.placement: Placement | None = None
        self.gpus: tuple[Placement, ...] = ()  # one per GPU while the experts spread over several
        self.prediction: Prediction | None = None
        self.prediction_without_tier: Prediction | None = None
        self.refusal: str | None = None
        self.chosen_cpu_threads: int | None = None  # None: as `replan` decides
        self.cpu_threads = 0

    @property
    def budgets(self) -> list[Budget]:
        return [self.gpu, *self.more_gpus, self.ram]

    @property
    def gpu_budget(self) -> int:
        return self.gpu.bytes

    @property
    def ram_budget(self) -> int:
        return self.ram.bytes

    @property
    def gpu_budgets(self) -> int | tuple[int, ...]:
        """The first GPU's budget, or one per GPU up to the last above 0 (the load request's)."""
        budgets = [self.gpu.bytes, *(budget.bytes for budget in self.more_gpus)]
        while len(budgets) > 1 and budgets[-1] == 0:
            budgets.pop()
        return tuple(budgets) if len(budgets) > 1 else budgets[0]

    @property
    def gpu_max(self) -> int:
        return self.gpu.top

    @property
    def ram_max(self) -> int:
        return self.ram.top

    @property
    def more_gpu_max(self) -> list[int]:
        return [budget.top for budget in self.more_gpus]

    @property
    def cpu_threads_max(self) -> int:
        """Every core but one (the engine's own thread drives the GPU); none without a GPU, where the CPU computes
        every expert already."""
        return max(self.machine.cores - 1, 0) if self.machine and self.machine.gpu_bytes else 0

    @property
    def cpu_tier_idle(self) -> str | None:
        """Why the CPU threads would compute no experts under this plan; None where they share the misses."""
        if self.placement is None:
            return None
        return cpu_tier_idle(self.facts, self.placement, self.machine.hardware, len(self.gpus))

    @property
    def contexts(self) -> list[int]:
        """The contexts to choose from: those the model was trained for."""
        longest = self.folder.config.get("max_position_embeddings", CONTEXTS[-1]) if self.folder else CONTEXTS[-1]
        return [tokens for tokens in CONTEXTS if tokens <= longest]

    @property
    def exceeds_ram(self) -> bool:
        """Without a GPU both budgets are RAM: together they may not fit in the machine's."""
        return bool(self.placement and not self.machine.gpu_bytes
                    and self.placement.device_bytes + self.placement.host_bytes > self.machine.ram_bytes)

    def open(self, path: str | None) -> None:
        """Plan for the model folder at `path` (None: no model); a UserError says why a folder cannot be
        planned. The budgets keep their positions until `start`."""
        self.path, self.folder, self.facts = path, None, None
        for budget in self.budgets:
            budget.pinned = None
        self.replan()
        if path is None:
            return
        folder = ModelFolder.open(path)
        facts = ModelFacts.from_folder(folder)
        if self.machine is None:
            self.machine = self._machine_source()
            self.more_gpus = [Budget() for _ in self.machine.more_gpu_bytes]
        self.folder = folder
        self.facts = replace(facts, fp8_kept=self.machine.device == "cuda")  # as the engine will hold them

    def start(self, speculates: bool) -> None:
        """The budgets a newly opened model starts with: the device's share of its memory (or all the plan
        needs), the experts in RAM up to its share, further GPUs off; the default context."""
        contexts = self.contexts
        self.context = DEFAULT_CONTEXT if DEFAULT_CONTEXT in contexts else next(iter(contexts), None)
        self.speculates = speculates
        machine, facts = self.machine, self.facts
        all_experts = facts.total_experts * facts.expert_bytes
        self.ram.top = min(machine.ram_bytes, all_experts)
        ram_default = min(all_experts, int(DEFAULT_RAM_SHARE * machine.ram_bytes))
        self._bound()
        # further GPUs start off: on the H200 pair, two GPUs decoded slower than one (bench/NOTES.md)
        for budget in self.more_gpus:
            budget.move(0)
        self.gpu.move(STEPS * min(self.gpu.top, int(DEFAULT_GPU_SHARE * machine.device_bytes)) // max(self.gpu.top, 1))
        if not machine.gpu_bytes:  # on the CPU both budgets are RAM: together they start within its share
            ram_default = min(ram_default, max(int(DEFAULT_GPU_SHARE * machine.ram_bytes) - self.gpu_budget, 0))
        self.ram.move(STEPS * ram_default // max(self.ram.top, 1))
        self.replan()

    def choose_context(self, context: int) -> None:
        self.context = context
        self._bound()
        self.replan()

    def choose_speculation(self, speculates: bool) -> None:
        """Whether the load speculates: its drafter's bytes come out of the device budget."""
        self.speculates = speculates
        self._bound()
        self.replan()

    def move(self, budget: Budget, position: int) -> None:
        budget.move(position)
        self.replan()

    def choose_cpu_threads(self, threads: int) -> None:
        self.chosen_cpu_threads = max(0, min(threads, self.cpu_threads_max))
        self.replan()

    def place(self, request: LoadModel) -> None:
        """A remembered load request's exact budgets and CPU threads (its context and speculation chosen
        already)."""
        gpu_budgets = request.gpu_budget if isinstance(request.gpu_budget, tuple) else (request.gpu_budget,)
        devices = [self.gpu, *self.more_gpus]
        given = [*gpu_budgets[: len(devices)], *[0] * (len(devices) - len(gpu_budgets)), request.ram_budget]
        for budget, size in zip(self.budgets, given, strict=True):
            if size is not None:
                budget.place(size)
        self.choose_cpu_threads(request.cpu_threads)

    def load_request(self, spec: str = "off", drafter: str | None = None, block_size: int | None = None) -> LoadModel:
        # the window asks for one answer at a time: the engine then keeps its captured passes between answers
        return LoadModel(self.path, device=self.machine.device, dtype=self.machine.dtype, gpu_budget=self.gpu_budgets,
                         ram_budget=self.ram_budget, context=self.context, spec=spec, drafter=drafter,
                         block_size=block_size, max_batch=1, cpu_threads=self.cpu_threads)

    def replan(self) -> None:
        self.placement, self.gpus, self.refusal = None, (), None
        self.prediction = self.prediction_without_tier = None
        if self.facts is None:
            return
        try:
            self.placement, self.gpus = plan_budgets(self.facts, self.gpu_budgets, self.ram_budget, self.context,
                                                     self._dtype_bytes)
        except UserError as error:
            self.refusal = self.machine.in_words(str(error))
            return
        predict = [self.facts, self.placement, self.gpus, self._dtype_bytes, self.machine.hardware]
        self.prediction_without_tier = without = predict_gpus(*predict)
        if self.chosen_cpu_threads is not None:
            self.cpu_threads = self.chosen_cpu_threads
            self.prediction = predict_gpus(*predict, cpu_threads=self.cpu_threads)
            return
        # not chosen: every core but one where the plan predicts them worth it (plan_cpu_tier.TIER_WORTH_IT)
        every_core = predict_gpus(*predict, cpu_threads=self.cpu_threads_max)
        worth_it = tier_worth_it(every_core, without)
        self.cpu_threads, self.prediction = (self.cpu_threads_max, every_core) if worth_it else (0, without)

    def _bound(self) -> None:
        """The device budget ends where the machine ends or where everything fits (for this context); with
        speculation, twice that (the drafter's bytes come out of the budget). A further GPU's ends where it
        holds every expert and their workspace: beyond that nothing is gained."""
        if self.facts is None:
            return
        everything = plan_placement(self.facts, None, None, self.context, self._dtype_bytes)
        self.gpu.top = min(self.machine.device_bytes,
                           everything.device_bytes * (SPECULATION_ROOM if self.speculates else 1))
        experts = expert_workspace(self.facts, self.context, self._dtype_bytes) + \
            self.facts.total_experts * self.facts.expert_bytes
        for budget, size in zip(self.more_gpus, self.machine.more_gpu_bytes, strict=True):
            budget.top = min(size, experts)

    @property
    def _dtype_bytes(self) -> int:
        return dtype_bytes(self.machine.dtype)
