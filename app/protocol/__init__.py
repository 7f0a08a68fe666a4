"""The contract between the engine process and its front doors (the CLI, the desktop app, the server): plain
dataclasses sent over multiprocessing queues, and the process that carries them. No torch here, and nothing
from `app.engine` (pyproject.toml's import contracts hold both)."""
