"""Requests: what a front door asks of the engine process."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Load `path` with this plan; `spec` ("off", "dflash" with the `drafter` folder, "mtp" for GLM) and
    `block_size` (None: the cost-aware policy) as in `moechat generate --spec`; `cpu_threads` as its
    `--cpu-threads`."""

    path: str
    device: str = "cpu"
    dtype: str = "float32"
    gpu_budget: int | tuple[int, ...] | None = None  # a tuple: one budget per GPU, the experts spread over them
    ram_budget: int | None = None
    context: int = 4096
    spec: str = "off"
    drafter: str | None = None
    block_size: int | None = None
    max_batch: int = 8  # generations decoded together (without speculation)
    cpu_threads: int = 0  # host cores computing part of the misses beside the GPU (the CPU expert tier; 0: none)


@dataclass(frozen=True, slots=True)
class Generate:
    """Exactly one of token_ids / text / messages (a chat rendered by the model's template)."""

    request_id: int
    max_new_tokens: int
    token_ids: list[int] | None = None
    text: str | None = None
    messages: list[dict] | None = None
    reasoning_effort: str | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop generation `request_id` (None: every generation, running or waiting, and a running load); a
    stopped generation ends with Done, stop_reason "cancelled", before the engine's next decode step."""

    request_id: int | None = None


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass
