"""Where models, chats, settings and logs live (the platform's user data folders)."""

from pathlib import Path

from platformdirs import user_data_dir

APP_NAME = "moechat"


def data_dir() -> Path:
    return Path(user_data_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    return data_dir() / "models"


def model_folder_for(repo_id: str) -> Path:
    """The default download folder of a hub repository: models/owner--name."""
    return models_dir() / repo_id.replace("/", "--")
