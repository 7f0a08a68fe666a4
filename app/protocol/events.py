"""Events: what the engine process tells its front door. A generation's are `Tokens` (one per step), then
`Done`; or an `Error`."""

from dataclasses import dataclass, field
from pathlib import Path

from app.protocol.kinds import ErrorKind, Piece, StopReason
from app.protocol.stats import GenerationStats, RemoteStats


@dataclass(frozen=True, slots=True)
class SpecStep:
    """One speculative step: it verified `block_size` positions (the anchor token and block_size - 1
    drafts) in one target pass and kept `accepted` drafts; the expert cache during that step."""

    block_size: int
    accepted: int
    experts_per_layer: float  # distinct experts the step touched, per MoE layer
    hits: int
    misses: int
    bytes_fetched: int
    prefetch_coverage: float
    prefetch_waste: float


@dataclass(frozen=True, slots=True)
class Tokens:
    """Tokens emitted by one decode step, and their text as (kind, text) pieces once a tokenizer has parsed
    them (a piece may hold the text of earlier tokens: a character is only handed out whole). With
    speculation, `drafted[i]` says whether token i was an accepted draft (the last token of a step never is)
    and `spec` describes the step."""

    token_ids: list[int]
    pieces: list[Piece] = field(default_factory=list)
    request_id: int = 0
    drafted: list[bool] = field(default_factory=list)
    spec: SpecStep | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The end of a generation; `stats` is None when it was cancelled before the engine summed it up."""

    stop_reason: StopReason
    stats: GenerationStats | RemoteStats | None = None
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class LoadProgress:
    stage: str
    fraction: float


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the engine loaded: the folder and its model type and vocabulary, the context (KV cache tokens),
    the placement (expert slots of all routed experts, device bytes), the speculation method, and how many
    generations decode together."""

    path: str
    model_type: str
    vocab_size: int
    context: int
    expert_slots: int
    total_experts: int
    device_bytes: int
    has_tokenizer: bool
    spec: str
    max_batch: int

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True, slots=True)
class Loaded:
    info: ModelInfo


@dataclass(frozen=True, slots=True)
class StepStats:
    """Decode figures over the last few steps (sent at most ~10 times a second); `residency[i]` is the
    fraction of the i-th MoE layer's experts resident in the device cache when it was sent; `cpu_computed`, of
    the misses, those the CPU expert tier computed instead of fetching them."""

    request_id: int
    tokens: int
    seconds: float
    hits: int
    misses: int
    bytes_fetched: int
    prefetch_coverage: float
    prefetch_waste: float
    residency: list[float] = field(default_factory=list)
    cpu_computed: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent every HEARTBEAT_S by a thread of the engine process, busy or not: silence means it is stopped
    or hung."""


@dataclass(frozen=True, slots=True)
class Error:
    """A failure, `message` in one readable line; `request_id` None for a load."""

    kind: ErrorKind
    message: str
    request_id: int | None = None
