"""The app's own state between runs, as JSON: the model library, unfinished downloads, the last model
loaded (to load it again at start), the theme and the chat settings saved as a model's default."""

import json
from pathlib import Path


class AppSettings:
    def __init__(self, path: Path):
        self.path = path
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.library: list[str] = saved.get("library", [])
        self.downloads: list[dict] = saved.get("downloads", [])  # {"repo_id", "revision", "folder"}
        self.remote: dict | None = saved.get("remote")  # the last remote model: {"base_url", "model", "api_key"}
        self.last_load: dict | None = saved.get("last_load")  # the fields of the last LoadModel that loaded
        self.load_at_start: bool = saved.get("load_at_start", True)
        self.theme: str = saved.get("theme", "system")
        self.model_defaults: dict[str, dict] = saved.get("model_defaults", {})  # model key -> chat settings

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"library": self.library, "downloads": self.downloads, "remote": self.remote,
                 "last_load": self.last_load, "load_at_start": self.load_at_start, "theme": self.theme,
                 "model_defaults": self.model_defaults}
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

    def remember_load(self, request: dict) -> None:
        self.last_load = request
        self.save()

    def set_load_at_start(self, enabled: bool) -> None:
        self.load_at_start = enabled
        self.save()

    def set_theme(self, theme: str) -> None:
        self.theme = theme
        self.save()

    def set_model_default(self, model: str, settings: dict) -> None:
        self.model_defaults[model] = settings
        self.save()

    def remember_download(self, repo_id: str, revision: str, folder: str) -> None:
        self.forget_download(folder)
        self.downloads.append({"repo_id": repo_id, "revision": revision, "folder": folder})
        self.save()

    def forget_download(self, folder: str) -> None:
        self.downloads = [d for d in self.downloads if d["folder"] != folder]
        self.save()
