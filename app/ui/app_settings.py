"""The app's own state between runs, as JSON: the model library and unfinished downloads."""

import json
from pathlib import Path


class AppSettings:
    def __init__(self, path: Path):
        self.path = path
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.library: list[str] = saved.get("library", [])
        self.downloads: list[dict] = saved.get("downloads", [])  # {"repo_id", "revision", "folder"}
        self.remote: dict | None = saved.get("remote")  # the last remote model: {"base_url", "model", "api_key"}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"library": self.library, "downloads": self.downloads, "remote": self.remote}
        self.path.write_text(json.dumps(state, indent=2))

    def add_model(self, folder: str) -> None:
        if folder not in self.library:
            self.library.append(folder)
            self.save()

    def remove_model(self, folder: str) -> None:
        self.library = [path for path in self.library if path != folder]
        self.save()

    def remember_remote(self, remote: dict) -> None:
        self.remote = remote
        self.save()

    def remember_download(self, repo_id: str, revision: str, folder: str) -> None:
        self.forget_download(folder)
        self.downloads.append({"repo_id": repo_id, "revision": revision, "folder": folder})
        self.save()

    def forget_download(self, folder: str) -> None:
        self.downloads = [d for d in self.downloads if d["folder"] != folder]
        self.save()
