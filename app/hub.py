"""Hugging Face downloads that survive restarts: list, check disk space, resume with HTTP ranges,
verify sha256, re-fetch a corrupt file once.

The hub API (revision, file tree) goes through `huggingface_hub`, so `HF_ENDPOINT` and `HF_TOKEN`
work as everywhere; file bytes are fetched here because a killed process must be able to resume
from its partial file. Partial files live in `DIR/.partial/` beside a note of the commit they
belong to; a finished file is verified, then moved into place.
"""

import hashlib
import http.client
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_url

from app.errors import UserError
from app.hub_errors import download_failure, lookup_failure
from app.sizes import format_size

CHUNK = 1 << 20
PARTIAL_DIR = ".partial"
# DFlash drafters published for targets this app runs
KNOWN_DRAFTERS = {
    "openai/gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
    "openai/gpt-oss-120b": "z-lab/gpt-oss-120b-DFlash",
}
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files only


@dataclass(frozen=True)
class Progress:
    """One update: the file being fetched and the totals; speed is a moving average."""

    file: str
    file_done: int
    file_size: int
    done: int
    total: int
    speed_bps: float

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.speed_bps if self.speed_bps > 0 else None


def parse_repo_id(text: str) -> str:
    """`owner/name` from itself or from a hub URL such as https://huggingface.co/owner/name/tree/main."""
    text = text.strip().rstrip("/")
    match = re.match(r"^https?://[^/]+/([\w.-]+/[\w.-]+)", text)
    repo_id = match.group(1) if match else text
    if not _REPO_ID.match(repo_id):
        raise UserError(f"'{text}' is not a model repository id like 'openai/gpt-oss-20b' or its URL")
    return repo_id


class Download:
    """One repository at one revision into one folder. `run()` may be called again after a stop."""

    def __init__(self, repo_id: str, folder: Path, revision: str = "main"):
        self.repo_id = parse_repo_id(repo_id)
        self.folder = Path(folder)
        self.revision = revision
        # read the environment now, not at import time, so HF_ENDPOINT / HF_TOKEN set later still count
        self.api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None)
        self.commit, self.files = self._list_files()

    def _list_files(self) -> tuple[str, list[RemoteFile]]:
        try:
            commit = self.api.model_info(self.repo_id, revision=self.revision).sha
            entries = self.api.list_repo_tree(self.repo_id, revision=commit, recursive=True)
            files = [RemoteFile(e.path, e.size, e.lfs.sha256 if e.lfs else None)
                     for e in entries if hasattr(e, "size")]
        except Exception as error:  # whichever library raised it, the user gets one sentence (app/hub_errors.py)
            raise UserError(lookup_failure(error, self.repo_id, self.revision, self.api.endpoint)) from None
        return commit, sorted(files, key=lambda f: f.path)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def missing_bytes(self) -> int:
        return sum(f.size - self.bytes_present(f) for f in self.files)

    def check_disk_space(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        free, needed = shutil.disk_usage(self.folder).free, self.missing_bytes()
        if needed > free:
            raise UserError(
                f"not enough disk space in {self.folder}: {format_size(needed)} still to download, "
                f"{format_size(free)} free"
            )

    def run(self, on_progress: Callable[[Progress], None] = lambda _: None,
            stop: threading.Event | None = None) -> bool:
        """Fetch what is missing. False when `stop` was set (partial files are kept for later)."""
        self.check_disk_space()
        meter = _Meter(self.total_bytes, self.total_bytes - self.missing_bytes(), on_progress)
        for remote in self.files:
            if self._complete(remote):
                continue
            for attempt in (1, 2):
                finished = self._fetch(remote, meter, stop)
                if not finished:
                    return False
                if self._verify_and_place(remote):
                    break
                if attempt == 2:
                    raise UserError(f"{remote.path} failed its sha256 check twice: the hub copy may be damaged")
        return True

    def cancel(self) -> None:
        """Forget the partial files (a stopped download can instead be resumed with `run`)."""
        shutil.rmtree(self.folder / PARTIAL_DIR, ignore_errors=True)

    def _partial(self, remote: RemoteFile) -> Path:
        return self.folder / PARTIAL_DIR / remote.path

    def _complete(self, remote: RemoteFile) -> bool:
        target = self.folder / remote.path
        return target.is_file() and target.stat().st_size == remote.size

    def bytes_present(self, remote: RemoteFile) -> int:
        if self._complete(remote):
            return remote.size
        partial = self._partial(remote)
        return partial.stat().st_size if partial.is_file() and self._same_commit(partial) else 0

    def _same_commit(self, partial: Path) -> bool:
        note = partial.with_name(partial.name + ".commit")
        return note.is_file() and note.read_text() == self.commit

    def _fetch(self, remote: RemoteFile, meter: "_Meter", stop: threading.Event | None) -> bool:
        partial = self._partial(remote)
        partial.parent.mkdir(parents=True, exist_ok=True)
        if not self._same_commit(partial):
            partial.unlink(missing_ok=True)
            partial.with_name(partial.name + ".commit").write_text(self.commit)
        offset = partial.stat().st_size if partial.exists() else 0
        if offset >= remote.size:
            return True
        request = urllib.request.Request(
            hf_hub_url(self.repo_id, remote.path, revision=self.commit, endpoint=self.api.endpoint),
            headers={"Range": f"bytes={offset}-", **_auth_headers()},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response, partial.open("ab") as out:
                if offset and response.status != 206:
                    out.truncate(0)  # the server ignored the range: start over
                    offset = 0
                meter.start_file(remote, offset)
                while chunk := response.read1(CHUNK):
                    out.write(chunk)
                    meter.add(len(chunk))
                    if stop is not None and stop.is_set():
                        return False
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise UserError(download_failure(error, remote.path, self.api.endpoint)) from None
        if partial.stat().st_size < remote.size:  # the server closed the connection before the file's end
            raise UserError(download_failure(None, remote.path, self.api.endpoint))
        return True

    def _verify_and_place(self, remote: RemoteFile) -> bool:
        partial = self._partial(remote)
        if partial.stat().st_size != remote.size or (remote.sha256 and _sha256(partial) != remote.sha256):
            partial.unlink()
            return False
        target = self.folder / remote.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
        partial.with_name(partial.name + ".commit").unlink(missing_ok=True)
        return True


class _Meter:
    """Running totals and an exponential moving average of the speed."""

    def __init__(self, total: int, done: int, report: Callable[[Progress], None]):
        self.total, self.done, self.report = total, done, report
        self.speed, self.last_time = 0.0, time.monotonic()
        self.file, self.file_done = RemoteFile("", 0, None), 0

    def start_file(self, remote: RemoteFile, already: int) -> None:
        self.file, self.file_done = remote, already
        self.last_time = time.monotonic()

    def add(self, count: int) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_time, 1e-6)
        self.speed = count / elapsed if self.speed == 0 else 0.8 * self.speed + 0.2 * count / elapsed
        self.last_time = now
        self.done += count
        self.file_done += count
        self.report(Progress(self.file.path, self.file_done, self.file.size, self.done, self.total, self.speed))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _auth_headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def write_manifest(download: Download) -> None:
    """Remember where a model came from, for the library and for drafter pairing."""
    manifest = {"repo_id": download.repo_id, "revision": download.revision, "commit": download.commit}
    (download.folder / ".moechat.json").write_text(json.dumps(manifest, indent=2))
