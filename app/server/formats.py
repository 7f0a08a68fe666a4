"""The OpenAI API's response bodies and stream chunks, for chat and for completions. Every one has an
extra `moechat` field (token ids, and the engine's stats at the end)."""

import time
import uuid

from app.protocol.kinds import PieceKind


class ChatFormat:
    opening = True  # a first chunk that only says who speaks

    def __init__(self, model_name: str):
        self.model, self.id, self.created = model_name, f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def whole(self, text: dict, finish_reason: str, usage: dict, extra: dict) -> dict:
        message = {"role": "assistant", "content": text.get(PieceKind.ANSWER, "")}
        if text.get(PieceKind.REASONING):
            message["reasoning_content"] = text[PieceKind.REASONING]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": usage, "moechat": extra}

    def chunk(self, text: dict, finish_reason: str | None, extra: dict, role: bool = False) -> dict:
        delta = {"role": "assistant", "content": ""} if role else {}
        if text.get(PieceKind.ANSWER):
            delta["content"] = text[PieceKind.ANSWER]
        if text.get(PieceKind.REASONING):
            delta["reasoning_content"] = text[PieceKind.REASONING]
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], "moechat": extra}

    def usage_chunk(self, usage: dict) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage}


class CompletionFormat:
    opening = False

    def __init__(self, model_name: str):
        self.model, self.id, self.created = model_name, f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def whole(self, text: dict, finish_reason: str, usage: dict, extra: dict) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.get(PieceKind.ANSWER, ""), "finish_reason": finish_reason,
                             "logprobs": None}], "usage": usage, "moechat": extra}

    def chunk(self, text: dict, finish_reason: str | None, extra: dict) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.get(PieceKind.ANSWER, ""), "finish_reason": finish_reason,
                             "logprobs": None}], "moechat": extra}

    def usage_chunk(self, usage: dict) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": usage}
