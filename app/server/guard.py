"""Who may talk to `moechat serve`, checked before any route (the documentation's included) runs:

- the API key, when the server has one (CORS preflights excepted: browsers send them without it);
- the Host a request names: a server without a key (so on loopback) answers only its own names, so that a
  web page cannot reach it through a domain that resolves to 127.0.0.1 (DNS rebinding);
- the Origin of browser requests: the server's own pages and the `--cors-origin` ones, no other;
- the size of the body, at most `max_body` bytes (413 past it, before the body is parsed).
"""

import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.server.api_errors import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Policy:
    api_key: str | None
    host_names: tuple[str, ...] | None  # the names a request's Host may carry; None: any
    cors_origins: tuple[str, ...] = ()  # "*" allows every origin
    max_body: int = 8 << 20


def policy_for(bound_host: str, api_key: str | None, cors_origins: tuple[str, ...], max_body: int) -> Policy:
    """A keyed server checks the key; a keyless one (only allowed on loopback) checks the Host instead."""
    names = None if api_key else (*LOOPBACK_NAMES, bound_host.strip("[]"))
    return Policy(api_key, names, cors_origins, max_body)


class RequestGuard:
    """ASGI middleware enforcing a `Policy`; refusals are OpenAI-shaped errors."""

    def __init__(self, app, policy: Policy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self._refusal(scope["method"], headers)
        if refusal is None:
            body = await _read_body(receive, self.policy.max_body, headers.get("content-length"))
            if body is None:
                refusal = ApiError(413, f"the request body is larger than this server takes ({self.policy.max_body} "
                                        "bytes, moechat serve --max-body)")
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, method: str, headers: dict) -> ApiError | None:
        policy = self.policy
        host = headers.get("host", "")
        if policy.host_names is not None and _host_name(host) not in policy.host_names:
            return ApiError(403, f"this server answers only requests for {', '.join(policy.host_names)}, not "
                                 f"'{host}' (a web page may be reaching it by DNS rebinding): use one of those "
                                 "names, or start the server with an API key", "permission_error")
        origin = headers.get("origin")
        if origin is not None and not self._allowed_origin(origin, host):
            return ApiError(403, f"requests from the web page origin '{origin}' are refused: start the server with "
                                 f"--cors-origin {origin} to let that page call it", "permission_error")
        preflight = method == "OPTIONS" and origin is not None and "access-control-request-method" in headers
        if policy.api_key is None or preflight:
            return None
        header = headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return ApiError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                            "authentication_error")
        if not secrets.compare_digest(header[7:].strip().encode(), self.policy.api_key.encode()):
            return ApiError(401, "invalid API key", "authentication_error")
        return None

    def _allowed_origin(self, origin: str, host: str) -> bool:
        same_origin = urlsplit(origin).netloc == host
        return same_origin or origin in self.policy.cors_origins or "*" in self.policy.cors_origins


def _host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    if host.startswith("["):
        return host[1:].split("]")[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _read_body(receive, limit: int, declared: str | None) -> bytes | None:
    """The whole body, or None once it is larger than `limit` (told by Content-Length or by counting)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """`receive` for the app: the body read already, then the connection's own messages (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed
