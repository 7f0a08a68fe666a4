"""The desktop app: PySide6 widgets only. Never imports torch or engine internals."""
