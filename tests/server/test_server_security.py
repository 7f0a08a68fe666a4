"""Who may call `moechat serve`: a keyless loopback server answers only its own host names and refuses
cross-origin browser requests unless --cors-origin allows them; the key can come from a file or the
environment (never only the command line, which every local user sees); the documentation routes are off
unless asked for, and then behind the key; a body larger than --max-body is refused before it is parsed."""

from pathlib import Path

import httpx
import pytest

from tests.fixtures.openai_server import API_KEY, moechat_serve

ALLOWED = "http://allowed.example"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def keyless(tiny_gpt_oss):
    with moechat_serve(tiny_gpt_oss, "--context", "256", "--cors-origin", ALLOWED, "--max-body", "64K",
                       api_key=None) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_with_docs(tiny_gpt_oss, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    with moechat_serve(tiny_gpt_oss, "--context", "256", "--docs", key_file=key_file) as server:
        yield server


def port_of(server) -> int:
    return int(server.base_url.split(":")[-1].split("/")[0])


def completion(server, **headers) -> httpx.Response:
    return httpx.post(f"{server.base_url}/completions", headers={**server.headers, **headers}, timeout=60,
                      json={"model": server.model, "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})


def test_a_keyless_server_answers_only_requests_for_its_own_names(keyless):
    port = port_of(keyless)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(f"{keyless.base_url}/models", headers={"Host": host}, timeout=30).status_code == 200, host
    rebound = httpx.get(f"{keyless.base_url}/models", headers={"Host": f"evil.example:{port}"}, timeout=30)
    assert rebound.status_code == 403
    assert rebound.json()["error"] == {
        "message": f"this server answers only requests for localhost, 127.0.0.1, ::1, 127.0.0.1, not "
                   f"'evil.example:{port}' (a web page may be reaching it by DNS rebinding): use one of those "
                   "names, or start the server with an API key",
        "type": "permission_error", "param": None, "code": None}
    assert completion(keyless, Host=f"evil.example:{port}").status_code == 403


def test_cross_origin_browser_requests_are_refused_unless_allowed(keyless):
    before = len(keyless.status()["recent"])
    refused = completion(keyless, Origin=EVIL)
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == (f"requests from the web page origin '{EVIL}' are refused: start "
                                                  f"the server with --cors-origin {EVIL} to let that page call it")
    assert len(keyless.status()["recent"]) == before  # it never reached the engine
    allowed = completion(keyless, Origin=ALLOWED)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED
    same_origin = completion(keyless, Origin=f"http://127.0.0.1:{port_of(keyless)}")
    assert same_origin.status_code == 200
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    ok = httpx.options(f"{keyless.base_url}/completions", headers={"Origin": ALLOWED, **preflight}, timeout=30)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED
    assert httpx.options(f"{keyless.base_url}/completions", headers={"Origin": EVIL, **preflight},
                         timeout=30).status_code == 403


def test_the_documentation_is_off_unless_asked_for(keyless):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(keyless.base_url.removesuffix("/v1") + path, timeout=30).status_code == 404, path


def test_a_body_past_the_limit_is_refused_before_it_is_read(keyless):
    big = {"model": keyless.model, "prompt": "x" * 70_000, "max_tokens": 2}
    declared = httpx.post(f"{keyless.base_url}/completions", json=big, timeout=60)
    assert declared.status_code == 413
    assert declared.json()["error"]["message"] == ("the request body is larger than this server takes (65536 bytes, "
                                                   "moechat serve --max-body)")
    chunked = httpx.post(f"{keyless.base_url}/completions", content=(b"x" * 8192 for _ in range(10)),
                         headers={"Content-Type": "application/json"}, timeout=60)
    assert chunked.status_code == 413


def test_the_documentation_asked_for_is_behind_the_key(keyed_with_docs):
    root = keyed_with_docs.base_url.removesuffix("/v1")
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(root + path, timeout=30).status_code == 401, path
    schema = httpx.get(root + "/openapi.json", headers=keyed_with_docs.headers, timeout=30)
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]
    assert httpx.get(root + "/docs", headers=keyed_with_docs.headers, timeout=30).status_code == 200


def test_a_key_from_a_file_or_the_environment_is_not_on_the_command_line(keyed_with_docs, served_tiny_gpt_oss):
    for server in (keyed_with_docs, served_tiny_gpt_oss):  # --api-key-file, and $MOECHAT_API_KEY
        command_line = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert API_KEY.encode() not in command_line
        assert completion(server).status_code == 200
        assert completion(server, Authorization="Bearer wrong").status_code == 401
