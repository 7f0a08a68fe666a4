"""`moechat serve`: load a model in an engine process, then answer the OpenAI API over HTTP with it."""

import errno
import ipaddress
import socket
import sys

import uvicorn

from app.engine.protocol import LoadModel, spawn_engine
from app.errors import UserError
from app.server.engine_link import EngineLink, load
from app.server.openai_api import create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: other machines may reach it


def check_binding(host: str, port: int, api_key: str | None) -> None:
    """Refuse, in words, a bind that would expose the model without a key, or a port already taken."""
    if not is_loopback(host) and not api_key:
        raise UserError(f"--host {host} lets other machines connect: give --api-key KEY (clients then send "
                        "'Authorization: Bearer KEY'), or bind to 127.0.0.1")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use: choose another with --port") from None
            raise UserError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def serve(load_request: LoadModel, host: str, port: int, api_key: str | None, model_name: str,
          max_queue: int) -> None:
    """Blocks until the server is stopped (Ctrl+C); at most max_batch + max_queue requests in flight."""
    check_binding(host, port, api_key)
    engine = spawn_engine()
    try:
        info = load(engine, load_request, lambda stage, fraction: print(
            f"\rmoechat: loading {model_name}: {stage} {fraction:.0%}   ", end="", file=sys.stderr, flush=True))
        print(file=sys.stderr)
        link = EngineLink(engine, info["max_batch"] + max_queue)
        app = create_app(link, model_name, info["context"], api_key)
        print(f"moechat: serving {model_name} at http://{host}:{port}/v1 ({info['max_batch']} decoding together, "
              f"{max_queue} waiting at most)", file=sys.stderr, flush=True)
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.stop()
