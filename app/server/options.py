"""How `moechat serve` answers: its address, who may call it, and the limits each request gets."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str = "model"
    max_queue: int = 16  # requests waiting beyond those decoding; more get 429
    cors_origins: tuple[str, ...] = ()  # web page origins whose scripts may call the API
    docs: bool = False  # /docs, /redoc, /openapi.json (behind the key like everything else)
    max_body: int = 8 << 20  # bytes; larger bodies get 413
    default_max_tokens: int = 1024  # the answer length of a chat that gives no max_tokens
    engine_timeout_s: float = 30.0  # silence from the engine process after which it is restarted
