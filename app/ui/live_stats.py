"""Ring buffers of the engine's running figures, for the live charts (no Qt here)."""

from collections import deque

from app.protocol.events import StepStats, Tokens

HISTORY = 600  # points per series: a minute at ~10 Hz


class LiveStats:
    """Series of (seconds since the first point, value). Step statistics give speed, cache and
    prefetch figures, the experts the CPU tier computed (from its first, so its zeros show too) and the
    cache's residency per layer (`residency`: seconds and one row of layer fractions each); speculative
    steps (Tokens.spec) give accepted drafts and block sizes."""

    SERIES = ("tok_s", "hit_rate", "prefetch_coverage", "prefetch_waste", "bytes_per_token",
              "cpu_experts_per_token", "accepted", "block_size")

    def __init__(self, clock):
        self.clock = clock
        self.start: float | None = None
        self.series = {name: (deque(maxlen=HISTORY), deque(maxlen=HISTORY)) for name in self.SERIES}
        self.residency: tuple[deque, deque] = (deque(maxlen=HISTORY), deque(maxlen=HISTORY))
        self.changed = False

    def add_step_stats(self, stats: StepStats) -> None:
        if stats.seconds <= 0:
            return
        self._add("tok_s", stats.tokens / stats.seconds)
        uses = stats.hits + stats.misses
        if uses:
            self._add("hit_rate", stats.hits / uses)
        if stats.prefetch_coverage or stats.prefetch_waste:
            self._add("prefetch_coverage", stats.prefetch_coverage)
            self._add("prefetch_waste", stats.prefetch_waste)
        if stats.tokens:
            self._add("bytes_per_token", stats.bytes_fetched / stats.tokens)
            if stats.cpu_computed or self.has("cpu_experts_per_token"):
                self._add("cpu_experts_per_token", stats.cpu_computed / stats.tokens)
        if stats.residency:
            times, rows = self.residency
            if rows and len(rows[-1]) != len(stats.residency):  # another model: its layers start afresh
                times.clear()
                rows.clear()
            times.append(self._seconds())
            rows.append(list(stats.residency))

    def add_tokens(self, events: list[Tokens]) -> None:
        for event in events:
            if event.spec is not None:
                self._add("accepted", event.spec.accepted)
                self._add("block_size", event.spec.block_size)

    def has(self, name: str) -> bool:
        return bool(self.series[name][0])

    def points(self, name: str) -> tuple[list[float], list[float]]:
        times, values = self.series[name]
        return list(times), list(values)

    def _add(self, name: str, value: float) -> None:
        times, values = self.series[name]
        times.append(self._seconds())
        values.append(value)

    def _seconds(self) -> float:
        now = self.clock()
        if self.start is None:
            self.start = now
        self.changed = True
        return now - self.start
