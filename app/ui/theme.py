"""Every colour of the app: a light and a dark palette, the one style sheet built from them, and the
switch that applies a choice ("system", "light", "dark") and follows the system's scheme under "system".

Widgets never name a colour: they take a `role` property or an object name that the style sheet
styles, or read `current()` where they paint (the placement bar, the charts, the chat's rich text)."""

from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

CHOICES = ("system", "light", "dark")


@dataclass(frozen=True)
class Palette:
    name: str
    window: str
    base: str  # text fields, lists, the assistant's bubbles, the charts
    alternate: str
    text: str
    muted: str  # secondary text: notes, reasoning, per-message figures
    border: str
    button: str
    highlight: str
    link: str
    user_bubble: str
    assistant_bubble: str
    code_background: str
    drafted: str  # answer text from accepted drafts, and the speculation chart's accepted series
    error: str
    warning: str
    banner_background: str
    banner_border: str
    series: dict[str, str] = field(default_factory=dict)  # a chart series' name -> its pen
    placement: dict[str, str] = field(default_factory=dict)  # a placement segment's name -> its fill

    @property
    def dark(self) -> bool:
        return QColor(self.window).lightnessF() < 0.5


_SEGMENTS = {"resident weights": "#4c6ef5", "KV cache": "#15aabf", "workspace": "#868e96", "expert slots": "#f59f00",
             "pinned RAM experts": "#82c91e", "on disk": "#e03131"}

LIGHT = Palette(
    name="light", window="#f3f4f6", base="#ffffff", alternate="#f1f3f5", text="#1f2328", muted="#59636e",
    border="#d0d7de", button="#f6f8fa", highlight="#2f6feb", link="#0b57d0", user_bubble="#eef2ff",
    assistant_bubble="#ffffff", code_background="#f1f3f5", drafted="#7048e8", error="#c92a2a", warning="#b35000",
    banner_background="#fff5f5", banner_border="#ffc9c9",
    series={"tok_s": "#4c6ef5", "hit_rate": "#2f9e44", "prefetch_coverage": "#2f9e44", "prefetch_waste": "#e03131",
            "bytes_per_token": "#f59f00", "cpu_experts_per_token": "#0c8599", "accepted": "#7048e8",
            "block_size": "#868e96"},
    placement={**_SEGMENTS, "unused budget": "#d0ebff", "free": "#e9ecef"},
)
DARK = Palette(
    name="dark", window="#1e1f22", base="#26282c", alternate="#2c2f34", text="#e6e7e9", muted="#a3aab2",
    border="#3d4148", button="#2e3136", highlight="#3b6fd8", link="#8ab4f8", user_bubble="#2a3354",
    assistant_bubble="#26282c", code_background="#1a1c20", drafted="#b197fc", error="#ff8787", warning="#ffb266",
    banner_background="#3b2225", banner_border="#7a3a40",
    series={"tok_s": "#748ffc", "hit_rate": "#51cf66", "prefetch_coverage": "#51cf66", "prefetch_waste": "#ff6b6b",
            "bytes_per_token": "#fcc419", "cpu_experts_per_token": "#3bc9db", "accepted": "#b197fc",
            "block_size": "#adb5bd"},
    placement={**_SEGMENTS, "unused budget": "#2b4a66", "free": "#3a3d42"},
)

_current = LIGHT
_switch: "ThemeSwitch | None" = None


def current() -> Palette:
    return _current


def style_sheet(p: Palette) -> str:
    return f"""
QFrame#message {{ background: {p.assistant_bubble}; border: 1px solid {p.border}; border-radius: 8px; }}
QFrame#message[role="user"] {{ background: {p.user_bubble}; }}
QFrame#message QLabel {{ background: transparent; }}
QWidget#banner {{ background: {p.banner_background}; border: 1px solid {p.banner_border}; border-radius: 6px; }}
QLabel[role="muted"] {{ color: {p.muted}; }}
QLabel[role="figures"] {{ color: {p.muted}; font-size: 11px; }}
QLabel[role="reasoning"] {{ color: {p.muted}; padding-left: 12px; }}
QLabel[role="error"] {{ color: {p.error}; }}
QLabel[role="warning"] {{ color: {p.warning}; }}
QLabel[role="headline"] {{ font-size: 18px; font-weight: 600; }}
"""


def qpalette(p: Palette) -> QPalette:
    palette = QPalette()
    roles = QPalette.ColorRole
    for role, colour in ((roles.Window, p.window), (roles.WindowText, p.text), (roles.Base, p.base),
                         (roles.AlternateBase, p.alternate), (roles.Text, p.text), (roles.Button, p.button),
                         (roles.ButtonText, p.text), (roles.ToolTipBase, p.base), (roles.ToolTipText, p.text),
                         (roles.PlaceholderText, p.muted), (roles.Highlight, p.highlight),
                         (roles.HighlightedText, "#ffffff"), (roles.Link, p.link), (roles.BrightText, p.error),
                         (roles.Mid, p.border), (roles.Midlight, p.alternate), (roles.Light, p.button)):
        palette.setColor(role, QColor(colour))
    disabled = QPalette.ColorGroup.Disabled
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        palette.setColor(disabled, role, QColor(p.muted))
    return palette


def switch() -> "ThemeSwitch":
    """The application's one theme switch (a palette and a style sheet are the whole application's)."""
    global _switch
    if _switch is None:
        _switch = ThemeSwitch(QApplication.instance())
    return _switch


class ThemeSwitch(QObject):
    """Applies a theme choice to the whole application; under "system" it follows the system's light or
    dark scheme as it changes. Use the application's one, `switch()`.

    Signals: changed(palette: Palette), after the application took the new palette."""

    changed = Signal(object)

    def __init__(self, app: QApplication):
        super().__init__(app)
        self.choice = "system"
        self._platform_dark = app.palette().window().color().lightnessF() < 0.5  # before it is replaced
        self._system_dark = self._scheme_is_dark(QGuiApplication.styleHints().colorScheme())
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_system_scheme)

    def choose(self, choice: str) -> None:
        if choice not in CHOICES:
            raise ValueError(f"theme {choice!r} is none of {CHOICES}")
        self.choice = choice
        self._apply()

    def _on_system_scheme(self, scheme: Qt.ColorScheme) -> None:
        self._system_dark = self._scheme_is_dark(scheme)
        if self.choice == "system":
            self._apply()

    def _scheme_is_dark(self, scheme: Qt.ColorScheme) -> bool:
        if scheme == Qt.ColorScheme.Unknown:  # a platform that does not say: its own palette does
            return self._platform_dark
        return scheme == Qt.ColorScheme.Dark

    def _apply(self) -> None:
        global _current
        dark = self._system_dark if self.choice == "system" else self.choice == "dark"
        _current = DARK if dark else LIGHT
        app = QApplication.instance()
        if app.style().name() != "fusion":
            app.setStyle("Fusion")  # the style that draws every widget from the palette, on every platform
        app.setPalette(qpalette(_current))
        app.setStyleSheet(style_sheet(_current))
        self.changed.emit(_current)
