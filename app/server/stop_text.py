"""OpenAI's `stop` strings over streamed text: the answer ends just before the first one."""


class StopText:
    """Hands out streamed text, holding back any tail that could still become a stop string."""

    def __init__(self, stops: list[str]):
        self.stops = [stop for stop in stops if stop]
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> str:
        """The text now safe to send; after a stop string, nothing more (and `stopped` is True)."""
        if self.stopped:
            return ""
        held = self._held + text
        found = [index for index in (held.find(stop) for stop in self.stops) if index >= 0]
        if found:
            self.stopped, self._held = True, ""
            return held[: min(found)]
        keep = max((length for stop in self.stops for length in range(1, len(stop))
                    if held.endswith(stop[:length])), default=0)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def finish(self) -> str:
        """What was held back, once the answer has ended without a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
