"""Hugging Face downloads that survive restarts: list, check disk space, resume with HTTP ranges,
verify every file, re-fetch a corrupt file once.

The hub API (revision, file tree) goes through `huggingface_hub`, so `HF_ENDPOINT` and `HF_TOKEN`
work as everywhere; file bytes are fetched here because a killed process must be able to resume
from its partial file. Partial files live in `DIR/.partial/` beside a note of the commit they
belong to; a finished file is verified, then moved into place.

What a download guarantees: a file is in place only once its bytes match the hub's hash (sha256 for
LFS files, git's blob id for the others); `run()` is True only when every listed file is; the manifest
is written only then. A run verifies what is already there and repairs it; `DIR/.moechat-verified.json`
stamps each verified file (size, times, inode) so that an unchanged one is not hashed again. Every path
the hub lists must stay inside DIR, or nothing is downloaded.
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
from pathlib import Path, PurePosixPath

from huggingface_hub import HfApi, hf_hub_url

from app.errors import UserError
from app.hub_errors import download_failure, lookup_failure
from app.sizes import format_size

CHUNK = 1 << 20
PARTIAL_DIR = ".partial"
MANIFEST_FILE = ".moechat.json"
STAMPS_FILE = ".moechat-verified.json"
OWN_NAMES = (PARTIAL_DIR, MANIFEST_FILE, STAMPS_FILE)
FETCH_ATTEMPTS = 3  # connections that end before the file does, resumed within one run
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
    blob_id: str | None = None  # git's blob id, the hub's ETag of a non-LFS file

    @property
    def digest(self) -> str | None:
        """What the file's bytes must hash to (sha256 or git blob id); None when the hub gives neither."""
        return self.sha256 or self.blob_id

    def hash_of(self, path: Path) -> str:
        return _sha256(path) if self.sha256 else _git_blob_id(path)


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
        for remote in self.files:
            self._target(remote)

    def _list_files(self) -> tuple[str, list[RemoteFile]]:
        try:
            commit = self.api.model_info(self.repo_id, revision=self.revision).sha
            entries = self.api.list_repo_tree(self.repo_id, revision=commit, recursive=True)
            files = [RemoteFile(e.path, e.size, e.lfs.sha256 if e.lfs else None, e.blob_id)
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
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"cannot make the download folder {self.folder}: {error.strerror}") from None
        free, needed = shutil.disk_usage(self.folder).free, self.missing_bytes()
        if needed > free:
            raise UserError(
                f"not enough disk space in {self.folder}: {format_size(needed)} still to download, "
                f"{format_size(free)} free"
            )

    def run(self, on_progress: Callable[[Progress], None] = lambda _: None,
            stop: threading.Event | None = None) -> bool:
        """Verify what is there and fetch what is missing or damaged. True once every file is verified in
        place; False when `stop` was set (partial files are kept for later); a UserError when a file could
        not be fetched whole or failed its check twice."""
        self.check_disk_space()
        meter = _Meter(self.total_bytes, self.total_bytes - self.missing_bytes(), on_progress)
        for remote in self.files:
            if self.verified(remote):
                continue
            (self.folder / MANIFEST_FILE).unlink(missing_ok=True)  # no longer a finished download
            if self._target(remote).is_file():  # there but damaged
                counted = self.bytes_present(remote)
                self._target(remote).unlink()
                meter.done += self.bytes_present(remote) - counted
            if not self._fetch_verified(remote, meter, stop):
                return False
        return True

    def cancel(self) -> None:
        """Forget the partial files (a stopped download can instead be resumed with `run`)."""
        shutil.rmtree(self.folder / PARTIAL_DIR, ignore_errors=True)

    def verified(self, remote: RemoteFile) -> bool:
        """The file is in place with the hub's bytes: its stamp says so, or hashing it does (then stamped)."""
        target = self._target(remote)
        if not target.is_file() or target.stat().st_size != remote.size:
            return False
        stamps = self._stamps()
        if stamps.get(remote.path) == _stamp(target, remote):
            return True
        if remote.digest is not None and remote.hash_of(target) != remote.digest:
            return False
        self._save_stamp(remote, stamps)
        return True

    def _target(self, remote: RemoteFile) -> Path:
        return _inside(self.folder, remote.path)

    def _partial(self, remote: RemoteFile) -> Path:
        return _inside(self.folder / PARTIAL_DIR, remote.path)

    def _complete(self, remote: RemoteFile) -> bool:
        target = self._target(remote)
        return target.is_file() and target.stat().st_size == remote.size

    def bytes_present(self, remote: RemoteFile) -> int:
        """Cheap: a file at its size counts whole (`run` verifies it)."""
        if self._complete(remote):
            return remote.size
        partial = self._partial(remote)
        return partial.stat().st_size if partial.is_file() and self._same_commit(partial) else 0

    def _same_commit(self, partial: Path) -> bool:
        note = partial.with_name(partial.name + ".commit")
        return note.is_file() and note.read_text() == self.commit

    def _fetch_verified(self, remote: RemoteFile, meter: "_Meter", stop: threading.Event | None) -> bool:
        """Fetch `remote` until it is verified in place; False when stopped."""
        ended_early = failed_check = 0
        while True:
            self._fetch(remote, meter, stop)
            if stop is not None and stop.is_set():
                return False
            have = self._partial(remote).stat().st_size
            if have < remote.size:
                ended_early += 1
                if ended_early == FETCH_ATTEMPTS:  # the server closed the connection before the file's end
                    raise UserError(download_failure(None, remote.path, self.api.endpoint))
                continue
            if self._verify_and_place(remote):
                return True
            failed_check += 1
            if failed_check == 2:
                raise UserError(f"{remote.path} failed its {'sha256' if remote.sha256 else 'git blob'} check "
                                "twice: the hub copy may be damaged")

    def _fetch(self, remote: RemoteFile, meter: "_Meter", stop: threading.Event | None) -> None:
        partial = self._partial(remote)
        partial.parent.mkdir(parents=True, exist_ok=True)
        if not self._same_commit(partial):
            partial.unlink(missing_ok=True)
            partial.with_name(partial.name + ".commit").write_text(self.commit)
        partial.touch()
        offset = partial.stat().st_size
        if offset >= remote.size:
            return
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
                        return
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise UserError(download_failure(error, remote.path, self.api.endpoint)) from None

    def _verify_and_place(self, remote: RemoteFile) -> bool:
        partial = self._partial(remote)
        if partial.stat().st_size != remote.size or (remote.digest and remote.hash_of(partial) != remote.digest):
            partial.unlink()
            return False
        target = self._target(remote)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
        partial.with_name(partial.name + ".commit").unlink(missing_ok=True)
        self._save_stamp(remote, self._stamps())
        return True

    def _stamps(self) -> dict:
        """path -> the stamp of the file verified there (same commit only)."""
        try:
            recorded = json.loads((self.folder / STAMPS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return recorded.get("files", {}) if recorded.get("commit") == self.commit else {}

    def _save_stamp(self, remote: RemoteFile, stamps: dict) -> None:
        stamps[remote.path] = _stamp(self._target(remote), remote)
        path = self.folder / STAMPS_FILE
        path.with_name(path.name + ".tmp").write_text(json.dumps({"commit": self.commit, "files": stamps}))
        os.replace(path.with_name(path.name + ".tmp"), path)


def _inside(folder: Path, remote_path: str) -> Path:
    """Where `remote_path` (a path the hub lists) goes under `folder`, refused if it could land elsewhere."""
    parts = remote_path.split("/")
    if (not remote_path or PurePosixPath(remote_path).is_absolute() or "\\" in remote_path
            or any(part in ("", ".", "..") for part in parts)
            or not (folder / remote_path).resolve().is_relative_to(folder.resolve())):
        raise UserError(f"the hub lists a file '{remote_path}' that would be written outside the download folder "
                        f"{folder}: refusing to download from it")
    if parts[0] in OWN_NAMES:
        raise UserError(f"the hub lists a file '{remote_path}' where this app keeps its own records in the download "
                        f"folder {folder}: refusing to download from it")
    return folder / remote_path


def _stamp(path: Path, remote: RemoteFile) -> list:
    """What says a verified file is unchanged: its identity on disk and the hash it was checked against."""
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, remote.digest]


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
    return _hash(hashlib.sha256(), path)


def _git_blob_id(path: Path) -> str:
    """git's id of a file's bytes: sha1 of "blob <size>\\0" and the bytes."""
    return _hash(hashlib.sha1(f"blob {path.stat().st_size}\0".encode()), path)


def _hash(digest, path: Path) -> str:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _auth_headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def write_manifest(download: Download) -> None:
    """Remember where a model came from, for the library and for drafter pairing; only for a download whose
    every file is verified in place."""
    unverified = [remote.path for remote in download.files if not download.verified(remote)]
    if unverified:
        raise UserError(f"{len(unverified)} files of {download.repo_id} are missing or unverified (the first: "
                        f"{unverified[0]}): run the download again")
    manifest = {"repo_id": download.repo_id, "revision": download.revision, "commit": download.commit}
    (download.folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
