"""The figures a generation ends with (`Done.stats`): the expert cache's work, and speculation's or batching's.
`as_dict` is their JSON: the object `moechat generate --json` prints under "stats" and the server sends as
`moechat.stats`; `from_dict` reads a moechat server's back."""

from dataclasses import asdict, dataclass, fields


@dataclass
class CacheStats:
    """Demand hits and misses per (layer, expert) use, bytes copied to the device (misses and
    prefetches), and how well look-ahead predictions matched the experts a layer then used."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    disk_reads: int = 0
    evictions: int = 0
    prefetches: int = 0
    predicted: int = 0  # experts predicted for layers that then ran
    predicted_used: int = 0  # of those, experts the layer really used
    used_after_prediction: int = 0  # experts used by layers that had a prediction
    cpu_computed: int = 0  # of the misses, those the CPU expert tier computed instead of fetching them

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses)

    @property
    def prefetch_coverage(self) -> float:
        """The share of the experts used after a prediction that it had predicted."""
        return self.predicted_used / self.used_after_prediction if self.predicted else 0.0

    @property
    def prefetch_waste(self) -> float:
        """The share of predicted experts that went unused."""
        return 1 - self.predicted_used / self.predicted if self.predicted else 0.0

    def since(self, earlier: "CacheStats") -> "CacheStats":
        return CacheStats(**{name: value - getattr(earlier, name) for name, value in self.__dict__.items()})

    def plus(self, other: "CacheStats") -> "CacheStats":
        return CacheStats(**{name: value + getattr(other, name) for name, value in self.__dict__.items()})

    def as_dict(self) -> dict[str, float]:
        return {**self.__dict__, "prefetch_coverage": self.prefetch_coverage, "prefetch_waste": self.prefetch_waste}

    @classmethod
    def from_dict(cls, figures: dict) -> "CacheStats":
        return cls(**{field.name: figures.get(field.name, field.default) for field in fields(cls)})


@dataclass(frozen=True, slots=True)
class SpecStats:
    """A speculative generation's steps: each verified `block_sizes[i]` positions and accepted
    `accepted_per_step[i]` drafts (so emitted that many + 1 tokens)."""

    policy: str  # "fixed" (every step verifies the block size asked for) or "cost-aware"
    steps: int
    block_sizes: list[int]
    accepted_per_step: list[int]
    mean_accepted: float


@dataclass(frozen=True, slots=True)
class BatchStats:
    steps: int
    mean_size: float  # generations per step, on average


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """The first token comes from the prefill (`ttft_s` after the start), the others from decode steps;
    `expert_cache` is the cache's work for this generation (a batch step's counts in full for each of its
    generations)."""

    prefill_tokens: int
    decode_tokens: int
    ttft_s: float
    decode_tok_s: float
    expert_cache: CacheStats
    spec: SpecStats | None = None
    batch: BatchStats | None = None

    def as_dict(self) -> dict:
        figures = {"prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens, "ttft_s": self.ttft_s,
                   "decode_tok_s": self.decode_tok_s, "expert_cache": self.expert_cache.as_dict()}
        for name, part in (("spec", self.spec), ("batch", self.batch)):
            if part is not None:
                figures[name] = asdict(part)
        return figures

    @classmethod
    def from_dict(cls, figures: dict) -> "GenerationStats":
        """The inverse of `as_dict`; a KeyError or TypeError names what a malformed one lacks."""
        spec, batch = figures.get("spec"), figures.get("batch")
        return cls(figures["prefill_tokens"], figures["decode_tokens"], figures["ttft_s"], figures["decode_tok_s"],
                   CacheStats.from_dict(figures["expert_cache"]), SpecStats(**spec) if spec else None,
                   BatchStats(**batch) if batch else None)


def stats_dict(stats: GenerationStats | None) -> dict:
    """The JSON of a Done's stats; {} for a generation cancelled before it had any."""
    return stats.as_dict() if stats is not None else {}


@dataclass(frozen=True, slots=True)
class RemoteStats:
    """An answer from a remote OpenAI-compatible server: its usage figures (None where it gave none), the time
    to its first chunk measured here, and a moechat server's own figures."""

    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    engine: GenerationStats | None = None
