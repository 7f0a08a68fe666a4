"""`moechat serve`: load a model in an engine process, then answer the OpenAI API over HTTP with it.

The engine process ends with the server, however the server is stopped: Ctrl+C and SIGTERM (as `kill`
and systemd send) shut it down in order; were the server killed outright, the engine notices that its
parent is gone and exits by itself (`app.protocol.engine_process.keep_in_touch`)."""

import errno
import ipaddress
import signal
import socket
import sys

import uvicorn

from app.errors import UserError
from app.protocol.requests import LoadModel
from app.server.engine_link import EngineLink
from app.server.openai_api import create_app
from app.server.options import ServerOptions


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


def serve(load_request: LoadModel, options: ServerOptions) -> None:
    """Blocks until the server is stopped (Ctrl+C, SIGTERM); at most max_batch + max_queue requests in flight."""
    check_binding(options.host, options.port, options.api_key)
    # uvicorn stops on SIGTERM, then raises it again: this handler turns it into SystemExit, so the engine is
    # stopped below (as it is on Ctrl+C), also when SIGTERM comes while the model loads
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    link = EngineLink(load_request, options.max_queue, options.engine_timeout_s)
    name = options.model_name
    try:
        info = link.load_first(lambda stage, fraction: print(
            f"\rmoechat: loading {name}: {stage} {fraction:.0%}   ", end="", file=sys.stderr, flush=True))
        print(file=sys.stderr)
        app = create_app(link, options)
        print(f"moechat: serving {name} at http://{options.host}:{options.port}/v1 ({info.max_batch} decoding "
              f"together, {options.max_queue} waiting at most)", file=sys.stderr, flush=True)
        uvicorn.run(app, host=options.host, port=options.port, log_level="warning")
    finally:
        link.stop()
