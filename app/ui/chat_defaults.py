"""Where a new chat's settings come from: the app's defaults, then the sampling a model ships in its
`generation_config.json`, then what the user saved as that model's default."""

from app.errors import UserError
from app.model_folder import read_generation_config
from app.protocol.events import ModelInfo
from app.remote import RemoteModel
from app.ui.app_settings import AppSettings
from app.ui.conversation import DEFAULT_SETTINGS

SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "reasoning_effort")  # what "reset sampling" resets
_FROM_GENERATION_CONFIG = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                           "max_new_tokens": "max_tokens"}


def model_key(info: ModelInfo | RemoteModel | None) -> str | None:
    """The name a model's saved default goes under: its folder, or a remote server's address and model id."""
    if info is None:
        return None
    return f"{info.base_url} {info.model}" if isinstance(info, RemoteModel) else info.path


def shipped_sampling(folder: str) -> dict:
    """The chat settings a model folder's generation_config.json gives (do_sample false: greedy)."""
    try:
        config = read_generation_config(folder)
    except UserError:
        return {}
    sampling = {ours: config[theirs] for theirs, ours in _FROM_GENERATION_CONFIG.items()
                if isinstance(config.get(theirs), int | float)}
    if config.get("do_sample") is False:
        sampling["temperature"] = 0.0
    return sampling


class ChatDefaults:
    def __init__(self, settings: AppSettings):
        self.settings = settings

    def for_model(self, info: ModelInfo | RemoteModel | None) -> dict:
        """A new chat's settings with the model loaded (None: no model)."""
        shipped = shipped_sampling(info.path) if isinstance(info, ModelInfo) else {}
        return {**DEFAULT_SETTINGS, **shipped, **self.settings.model_defaults.get(model_key(info), {})}

    def save(self, info: ModelInfo | RemoteModel, settings: dict) -> None:
        self.settings.set_model_default(model_key(info), settings)
