"""Downloads in the window against a local server that speaks the hub's protocol: the file list,
pause, resume after the app restarts, the finished model in the library, its drafter offered."""

import socket

import pytest
from PySide6.QtCore import Qt

from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow
from tests.fixtures.hub_server import FakeHub

REPO = "openai/gpt-oss-20b"  # a known target: its DFlash drafter is offered once it is here


@pytest.fixture
def hub(tiny_gpt_oss, monkeypatch):
    files = {p.name: p.read_bytes() for p in tiny_gpt_oss.iterdir() if p.is_file()}
    with FakeHub(REPO, files, {name for name in files if name.endswith(".safetensors")}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def open_window(qtbot, data_dir) -> MainWindow:
    window = MainWindow(data_dir, machine=Machine(16 * GIB))
    qtbot.addWidget(window)
    window.show()
    window.tabs.setCurrentIndex(1)
    return window


def look_up(window, qtbot, text: str) -> None:
    window.downloads.repo.setText(text)
    qtbot.mouseClick(window.downloads.look_up_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Looking up" not in window.downloads.summary.text(), timeout=10_000)


def test_a_paused_download_resumes_after_a_restart_and_lands_in_the_library(hub, qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    look_up(window, qtbot, f"https://huggingface.co/{REPO}/tree/main")
    panel = window.downloads
    total = sum(map(len, hub.files.values()))
    assert panel.files.rowCount() == len(hub.files)
    assert sorted(panel.files.item(row, 0).text() for row in range(len(hub.files))) == sorted(hub.files)
    assert REPO in panel.summary.text() and "free" in panel.summary.text()

    hub.delay_s = 0.01
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: hub.bytes_served > 60_000, timeout=20_000)
    assert "/s" in panel.status.text() and "left" in panel.status.text()
    qtbot.mouseClick(panel.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.running, timeout=10_000)
    assert panel.status.text().startswith("Paused") and panel.download_button.text() == "Resume"
    served = hub.bytes_served
    window.close()

    hub.delay_s = 0.0
    again = open_window(qtbot, tmp_path)
    panel = again.downloads
    assert panel.repo.text() == REPO and "Unfinished download" in panel.status.text()
    look_up(again, qtbot, REPO)
    have = total - panel.job.download.missing_bytes()
    assert 0 < have < total and panel.download_button.text() == "Resume"
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000) as downloaded:
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert hub.bytes_served - served <= total - have + 4 * 4096  # only the missing bytes (and in-flight chunks)
    folder = downloaded.args[0]
    assert again.settings.downloads == [] and again.settings.library == [folder]
    assert again.library.selected_path() == folder and REPO in again.library.list.currentItem().text()
    assert again.budget.plan.placement is not None  # the budget panel plans the new model at once

    drafter = again.library.drafter_button
    assert drafter.isVisibleTo(again) and "z-lab/gpt-oss-20b-DFlash" in drafter.text()
    qtbot.mouseClick(drafter, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "has no model 'z-lab/gpt-oss-20b-DFlash'" in panel.problem.text(), timeout=10_000)
    assert panel.retry_button.isVisible() and panel.dismiss_button.isVisible()
    again.close()


def test_cancel_deletes_the_partial_files(hub, qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    look_up(window, qtbot, REPO)
    panel = window.downloads
    hub.delay_s = 0.01
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: hub.bytes_served > 30_000, timeout=20_000)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Cancelled"), timeout=10_000)
    assert not (panel.job.download.folder / ".partial").exists() and window.settings.downloads == []
    window.close()


def test_a_full_disk_is_reported_before_anything_is_fetched(hub, qtbot, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**6, 10**6 - 1000, 1000))
    window = open_window(qtbot, tmp_path)
    look_up(window, qtbot, REPO)
    assert "not enough disk space" in window.downloads.status.text()
    assert not window.downloads.download_button.isEnabled() and hub.bytes_served == 0
    window.close()


def test_a_dropped_look_up_says_so_and_retry_lists_the_files(hub, qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    panel = window.downloads
    hub.drop_after = 0
    look_up(window, qtbot, REPO)
    assert panel.problem_row.isVisible() and "dropped while looking up" in panel.problem.text()
    assert panel.summary.text() == f"Could not look up {REPO}." and panel.files.rowCount() == 0
    hub.drop_after = None
    qtbot.mouseClick(panel.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.files.rowCount() == len(hub.files), timeout=10_000)
    assert not panel.problem_row.isVisible() and panel.download_button.isEnabled()
    window.close()


def test_no_hub_to_reach_is_one_sentence_and_cancel_goes_back(qtbot, tmp_path, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    window = open_window(qtbot, tmp_path)
    panel = window.downloads
    look_up(window, qtbot, REPO)
    assert panel.problem.text() == (f"Cannot connect to 127.0.0.1:{port}: the network or the hub is down. "
                                    "Check the connection, then Retry.")
    assert panel.retry_button.isVisible() and panel.dismiss_button.text() == "Cancel"
    qtbot.mouseClick(panel.dismiss_button, Qt.MouseButton.LeftButton)
    assert not panel.problem_row.isVisible() and panel.job is None
    assert panel.summary.text() == "Download a model from the Hugging Face hub." and panel.look_up_button.isEnabled()
    window.close()


def test_a_connection_dropped_mid_download_keeps_the_partial_files_and_retry_resumes(hub, qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    panel = window.downloads
    look_up(window, qtbot, REPO)
    hub.drop_after = 30_000
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.problem_row.isVisible(), timeout=20_000)
    assert "dropped while downloading" in panel.problem.text() and not panel.running
    assert panel.download_button.text() == "Resume" and window.settings.downloads  # still to finish
    hub.drop_after = None
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000):
        qtbot.mouseClick(panel.retry_button, Qt.MouseButton.LeftButton)
    assert window.settings.downloads == []
    window.close()
