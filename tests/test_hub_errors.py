"""A hub that cannot be used, as one plain sentence: no network, nothing listening, an unknown or gated
repository, a connection that drops during the look-up or mid-file. Against real local servers, from the
library and from `moechat download` (one line on stderr, no traceback)."""

import socket
import subprocess
import sys

import pytest

from app.errors import UserError
from app.hub import Download
from tests.test_hub import REPO, assert_complete, hub  # noqa: F401 (the fake hub fixture, found by its name)


@pytest.fixture
def fake_hub(request):
    """test_hub's fake hub, serving its files and named HF_ENDPOINT."""
    return request.getfixturevalue("hub")


@pytest.fixture
def nothing_listening(monkeypatch):
    """An endpoint on a port of this machine that nothing listens on (as a hub that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return f"127.0.0.1:{port}"


def download_cli(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "download", REPO, "--dir", str(tmp_path / "m"), *args],
                          capture_output=True, text=True, timeout=120)


def test_nothing_listening_is_one_sentence_from_the_library_and_one_line_from_the_cli(nothing_listening, tmp_path):
    with pytest.raises(UserError) as raised:
        Download(REPO, tmp_path / "m")
    assert str(raised.value) == (f"Cannot connect to {nothing_listening}: the network or the hub is down. "
                                 "Check the connection, then Retry.")
    done = download_cli(tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"moechat: error: {raised.value}\n"  # one line, no traceback


def test_no_network_names_the_host_it_could_not_find(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")  # a name no resolver knows, as when offline
    done = download_cli(tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("moechat: error: No network: hub.invalid cannot be found. Check the connection, "
                           "then Retry.\n")


def test_an_unknown_repository(fake_hub, tmp_path):
    with pytest.raises(UserError, match=r"^The hub has no model 'other/thing': check its name"):
        Download("other/thing", tmp_path / "m")


def test_a_gated_repository_without_a_token_and_with_one_that_has_no_access(fake_hub, tmp_path, monkeypatch):
    fake_hub.gated = True
    with pytest.raises(UserError) as raised:
        Download(REPO, tmp_path / "m")
    assert str(raised.value).startswith(f"'{REPO}' is gated: accept its terms on its page at 127.0.0.1")
    assert "set HF_TOKEN" in str(raised.value)
    monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
    done = download_cli(tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert f"'{REPO}' is gated and the token in HF_TOKEN has no access to it yet" in done.stderr


def test_a_connection_dropped_during_the_look_up(fake_hub, tmp_path):
    fake_hub.drop_after = 0
    with pytest.raises(UserError) as raised:
        Download(REPO, tmp_path / "m")
    assert str(raised.value) == f"The connection to {fake_hub.url.removeprefix('http://')} dropped while looking up " \
                                f"'{REPO}': Retry."


def test_a_connection_dropped_mid_file_is_said_and_the_download_resumes(fake_hub, tmp_path):
    download = Download(REPO, tmp_path / "m")
    fake_hub.drop_after = 100_000
    with pytest.raises(UserError) as raised:
        download.run()
    assert "dropped while downloading model-00001-of-00002.safetensors: Retry" in str(raised.value)
    assert "resumes where it stopped" in str(raised.value)
    kept = download.total_bytes - download.missing_bytes()
    assert kept >= 90_000  # the partial file stays for the retry
    fake_hub.drop_after = None
    served = fake_hub.bytes_served
    assert Download(REPO, tmp_path / "m").run()
    assert_complete(tmp_path / "m")
    assert fake_hub.bytes_served - served <= download.total_bytes - kept  # only what was missing
