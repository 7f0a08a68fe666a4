"""Downloads that cannot lie: connections that end mid-file, files damaged in place, paths that lead out
of the download folder, and the stamps that spare re-hashing, against a real local hub server."""

import os
import re
import subprocess
import sys
import threading

import pytest

from app import hub as hub_module
from app.errors import UserError
from app.hub import MANIFEST_FILE, Download, write_manifest
from tests import test_hub
from tests.fixtures.hub_server import FakeHub
from tests.test_hub import FILES, LFS, REPO, assert_complete

hub = test_hub.hub  # the same fixture: the fake hub serving FILES

SHARD = "model-00001-of-00002.safetensors"  # 600 000 bytes, LFS
CONFIG = "config.json"  # not LFS


def download_command(folder) -> list[str]:
    return [sys.executable, "-m", "app", "download", REPO, "--dir", str(folder)]


def damage_in_place(path) -> None:
    """Flip one byte in the middle: same size, same name."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_connection_that_keeps_ending_mid_file_fails_the_cli_and_leaves_no_manifest(hub, tmp_path):
    hub.cut_after[SHARD] = 100_000
    folder = tmp_path / "m"
    failed = subprocess.run(download_command(folder), capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("moechat: error: The connection to ") and f"dropped while downloading {SHARD}" in last, \
        failed.stderr
    assert "Traceback" not in failed.stderr and "done" not in failed.stderr
    assert not (folder / MANIFEST_FILE).exists() and not (folder / SHARD).exists()
    assert (folder / ".partial" / SHARD).stat().st_size == 300_000  # kept for the next run

    hub.cut_after.clear()
    before = hub.bytes_served
    done = subprocess.run(download_command(folder), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_complete(folder)
    assert (folder / MANIFEST_FILE).is_file()
    assert hub.bytes_served - before == sum(map(len, FILES.values())) - 300_000 - len(FILES[CONFIG])


def test_a_connection_that_ends_once_is_resumed_within_the_same_run(hub, tmp_path):
    hub.cut_after[SHARD] = 400_000  # the first response ends early, the resumed one brings the rest
    assert Download(REPO, tmp_path / "m").run()
    assert_complete(tmp_path / "m")


def test_files_damaged_in_place_are_found_and_fetched_again_on_a_rerun(hub, tmp_path):
    folder = tmp_path / "m"
    download = Download(REPO, folder)
    assert download.run()
    write_manifest(download)
    damage_in_place(folder / SHARD)
    damage_in_place(folder / CONFIG)
    before = hub.bytes_served
    rerun = Download(REPO, folder)
    assert rerun.missing_bytes() == 0  # the cheap estimate trusts sizes; run() checks the bytes
    stopped = threading.Event()
    stopped.set()
    assert not rerun.run(stop=stopped)
    assert not (folder / MANIFEST_FILE).exists()  # a folder with a damaged file is no finished download
    assert rerun.run()
    assert_complete(folder)
    assert hub.bytes_served - before == len(FILES[SHARD]) + len(FILES[CONFIG])


def test_an_unchanged_verified_file_is_not_hashed_again(hub, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    assert Download(REPO, folder).run()
    hashed = []
    real_hash = hub_module._hash
    monkeypatch.setattr(hub_module, "_hash", lambda digest, path: hashed.append(path.name) or real_hash(digest, path))
    assert Download(REPO, folder).run()
    assert hashed == []
    os.utime(folder / SHARD)  # touched, not changed: hashed once more, then stamped again
    assert Download(REPO, folder).run()
    assert Download(REPO, folder).run()
    assert hashed == [SHARD]


def test_the_manifest_is_refused_while_a_file_is_unverified(hub, tmp_path):
    stop = threading.Event()
    download = Download(REPO, tmp_path / "m")
    assert not download.run(lambda progress: stop.set() if progress.done > 350_000 else None, stop)
    with pytest.raises(UserError, match="missing or unverified"):
        write_manifest(download)
    assert not (tmp_path / "m" / MANIFEST_FILE).exists()


@pytest.mark.parametrize(("listed", "why"), [
    ("../../escape.txt", "that would be written outside the download folder"),
    ("nested/../../../escape.txt", "that would be written outside the download folder"),
    ("{tmp_path}/escape.txt", "that would be written outside the download folder"),
    (".partial/x.safetensors", "where this app keeps its own records in the download folder"),
])
def test_a_listed_path_that_leads_out_of_the_folder_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, listed, why):
    listed = listed.format(tmp_path=tmp_path)  # an absolute path, inside this test's folder all the same
    files = {CONFIG: FILES[CONFIG], listed: b"written where it does not belong"}
    folder = tmp_path / "downloads" / "m"
    with FakeHub(REPO, files, set()) as evil:
        monkeypatch.setenv("HF_ENDPOINT", evil.url)
        with pytest.raises(UserError, match=f"the hub lists a file '{re.escape(listed)}' {why}"):
            Download(REPO, folder).run()
        result = subprocess.run(download_command(folder), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"moechat: error: the hub lists a file '{listed}' {why} {folder}: refusing to download from it"]
    assert evil.bytes_served == 0
    assert not folder.exists()
    assert not [p for p in tmp_path.rglob("*escape*")]


def test_a_hub_copy_that_never_matches_its_git_blob_id_is_refused(hub, tmp_path):
    hub.corrupt.add(CONFIG)
    with pytest.raises(UserError, match=r"config\.json failed its git blob check twice"):
        Download(REPO, tmp_path / "m").run()
    assert not (tmp_path / "m" / CONFIG).exists()


def test_lfs_files_are_listed_with_their_sha256_and_the_others_with_their_blob_id(hub, tmp_path):
    download = Download(REPO, tmp_path / "m")
    assert {f.path for f in download.files if f.sha256} == LFS
    assert all(f.blob_id for f in download.files)
