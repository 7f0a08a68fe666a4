"""Chat logic without widgets: what the engine is asked, and the answer while it streams in.

An answer is a stored message from its first moment (`complete=False`); its text is written when
the engine finishes, is stopped, or dies, so a partial answer is never lost.
"""

import time

from app.chats import ChatStore, Message
from app.protocol.events import Done, Tokens
from app.protocol.kinds import PieceKind
from app.protocol.stats import GenerationStats, RemoteStats

DEFAULT_SETTINGS = {
    "system_prompt": "",
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_tokens": 2048,
    "reasoning_effort": "medium",
    "colour_drafted": False,
}
TITLE_CHARS = 40


def chat_settings(store: ChatStore, chat_id: int) -> dict:
    return {**DEFAULT_SETTINGS, **store.chat(chat_id).settings}


def title_for(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= TITLE_CHARS else words[: TITLE_CHARS - 1].rstrip() + "…"


def engine_messages(store: ChatStore, last_id: int, system_prompt: str) -> list[dict]:
    """The conversation up to `last_id` as the engine's chat messages (reasoning is not sent back)."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return system + [{"role": m.role, "content": m.content} for m in store.path_to(last_id)]


class Answer:
    """The assistant message being generated for `request_id`, a new one or, `continues`, the end of an
    answer that stopped at its token limit (its text so far is kept and the new text added to it).

    `drafted_spans` are [start, end) character ranges of `text` from speculative steps that accepted
    drafts. Colour is per step, not per token: a step's pieces are the parser's text for all its tokens
    together (a token may hold half a character, or a marker the parser swallows), so the step's last
    token, the target's own, is coloured with its drafts. `tokens` counts this generation's tokens."""

    def __init__(self, store: ChatStore, chat_id: int, parent_id: int, request_id: int, model: str = "",
                 clock=time.perf_counter, continues: Message | None = None):
        self.store, self.chat_id, self.request_id, self.model, self.clock = store, chat_id, request_id, model, clock
        if continues is None:
            self.message_id = store.add_message(chat_id, parent_id, "assistant", "", complete=False)
        else:
            self.message_id = continues.id
        self.text = continues.content if continues else ""
        self.reasoning = continues.reasoning if continues else ""
        self.earlier_tokens = (continues.stats.get("tokens") or 0) if continues else 0
        self.tokens = 0
        self.accepted: list[int] = []
        self.drafted_spans: list[list[int]] = [list(span) for span in continues.stats.get("drafted_spans", [])] \
            if continues else []
        self.started = clock()
        self.first_token_at: float | None = None

    def add(self, events: list[Tokens]) -> None:
        for event in events:
            if event.token_ids and self.first_token_at is None:
                self.first_token_at = self.clock()
            self.tokens += len(event.token_ids)
            drafted = any(event.drafted)
            for kind, text in event.pieces:
                if kind == PieceKind.REASONING:
                    self.reasoning += text
                else:
                    if drafted and text:
                        self._mark_drafted(len(self.text), len(self.text) + len(text))
                    self.text += text
            if event.spec is not None:
                self.accepted.append(event.spec.accepted)

    def _mark_drafted(self, start: int, end: int) -> None:
        if self.drafted_spans and self.drafted_spans[-1][1] == start:
            self.drafted_spans[-1][1] = end
        else:
            self.drafted_spans.append([start, end])

    def finish(self, done: Done) -> dict:
        stats = self._stats(done.stop_reason, done.stats)
        self._store(done.stop_reason.finished, stats)
        return stats

    def interrupt(self, reason: str) -> dict:
        """The engine died or failed mid-answer: keep what came, marked incomplete."""
        stats = self._stats(reason, None)
        self._store(False, stats)
        return stats

    def _store(self, complete: bool, stats: dict) -> None:
        self.store.update_message(self.message_id, self.text, reasoning=self.reasoning, complete=complete, stats=stats)

    def _stats(self, stop_reason: str, reported: GenerationStats | RemoteStats | None) -> dict:
        """The stored figures: the engine's where it sent them (a remote moechat server's too), else the ones
        measured here; a stop reason, or the words for why the answer was interrupted."""
        now = self.clock()
        remote = isinstance(reported, RemoteStats)
        engine = reported.engine if remote else reported
        # a remote server that sends no token ids may still count them in its usage; None: it did not say
        tokens = reported.completion_tokens if remote and not self.tokens else self.tokens
        stats = {"stop_reason": stop_reason, "tokens": tokens if tokens is None else self.earlier_tokens + tokens}
        if self.model:
            stats["model"] = self.model
        prompt = reported.prompt_tokens if remote else engine.prefill_tokens if engine else None
        if prompt is not None and tokens is not None:
            stats["context_tokens"] = prompt + tokens  # what the conversation fills of the context now
        if engine is not None:
            stats["tok_s"] = engine.decode_tok_s
            stats["ttft_s"] = engine.ttft_s
        elif self.first_token_at is not None:
            stats["ttft_s"] = self.first_token_at - self.started
            if self.tokens > 1 and now > self.first_token_at:
                stats["tok_s"] = (self.tokens - 1) / (now - self.first_token_at)
        elif remote:
            stats["ttft_s"] = reported.ttft_s
            stats["tok_s"] = None  # no token timings from this server
        if self.drafted_spans:
            stats["drafted_spans"] = self.drafted_spans
        if engine is not None and engine.spec is not None:
            stats["mean_accepted"] = engine.spec.mean_accepted
        elif self.accepted:
            stats["mean_accepted"] = sum(self.accepted) / len(self.accepted)
        return stats
