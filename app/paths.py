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


# The demo model shipped in the repository (tools/train_demo.py): a folder beside the `app` package.
BUNDLED_MODELS = Path(__file__).resolve().parents[1] / "resources" / "models"
DEMO_MODEL = BUNDLED_MODELS / "demo-gpt-oss"
DEMO_DRAFTER = BUNDLED_MODELS / "demo-gpt-oss-dflash"
DEMO_NAME = "demo"


def resolve_model(name: str, drafter: bool = False) -> str:
    """A MODEL (or --drafter) argument as a folder: `demo` names the bundled demo model (or its drafter)
    unless a folder of that name exists here."""
    if name == DEMO_NAME and not Path(name).exists():
        return str(DEMO_DRAFTER if drafter else DEMO_MODEL)
    return name
