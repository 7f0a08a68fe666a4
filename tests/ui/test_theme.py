"""Themes: the window follows the system's light or dark scheme, View ▸ Theme overrides it (and is
remembered), the chat stays readable in both (measured on the rendered pixels), the charts follow, and no
widget names a colour of its own."""

import re
from collections import Counter
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication

import app.ui
from app.chats import ChatStore
from app.protocol.events import StepStats
from app.ui import theme
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow

MACHINE = Machine(16 * GIB)
COLOUR = re.compile(r"#[0-9a-fA-F]{6}\b|\brgb\(|QColor\(\s*['\"]#")


def relative_luminance(colour: QColor) -> float:
    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast(first: QColor, second: QColor) -> float:
    """The WCAG contrast ratio of two colours (1 to 21; body text needs 4.5)."""
    lighter, darker = sorted((relative_luminance(first), relative_luminance(second)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def text_contrast(widget) -> float:
    """The contrast of a widget's text with what is behind it, read off the pixels its parent renders there
    (a label is transparent: its bubble shows through): the commonest colour is the background, the one
    farthest from it in luminance the text."""
    image = widget.parentWidget().grab(widget.geometry()).toImage()
    pixels = Counter(image.pixel(x, y) for x in range(image.width()) for y in range(image.height()))
    background = QColor.fromRgb(pixels.most_common(1)[0][0])
    ink = max((QColor.fromRgb(rgb) for rgb in pixels), key=lambda c: abs(relative_luminance(c) -
                                                                        relative_luminance(background)))
    return contrast(background, ink)


def chat_window(qtbot, tmp_path) -> MainWindow:
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("Colours")
    question = store.add_message(chat, None, "user", "Which colour is the sky?")
    store.add_message(chat, question, "assistant", "Blue, mostly:\n\n```python\nsky = 'blue'\n```",
                      reasoning="Rayleigh scattering.", stats={"tokens": 9, "tok_s": 30.0, "stop_reason": "stop"})
    store.close()
    window = MainWindow(tmp_path, machine=MACHINE)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def assert_readable(window) -> None:
    question, answer = window.chat.view.widgets
    answer.reasoning_toggle.setChecked(True)
    for widget in (question.body, answer.body, answer.reasoning, answer.figures, window.chat.composer):
        assert text_contrast(widget) >= 4.5, widget
    bubble = QColor(theme.current().user_bubble)
    assert contrast(bubble, question.body.palette().windowText().color()) >= 4.5


def test_the_chat_is_readable_under_a_dark_system_scheme(qtbot, tmp_path):
    window = chat_window(qtbot, tmp_path)
    assert not theme.current().dark  # offscreen Qt has no scheme of its own: its palette is light
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # as the desktop sends it
    assert theme.current() is theme.DARK and QGuiApplication.palette().window().color() == QColor(theme.DARK.window)
    assert_readable(window)
    bubble = window.chat.view.widgets[0].grab().toImage().pixelColor(20, 4)
    assert bubble == QColor(theme.DARK.user_bubble)  # the bubble itself turned dark, not only the text light
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert theme.current() is theme.LIGHT
    assert_readable(window)
    window.close()


def test_view_theme_overrides_the_system_and_is_remembered(qtbot, tmp_path):
    window = chat_window(qtbot, tmp_path)
    window.menus.actions["theme dark"].trigger()
    assert theme.current() is theme.DARK and window.settings.theme == "dark"
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)  # the system no longer decides
    assert theme.current() is theme.DARK
    assert_readable(window)
    code = window.chat.view.widgets[1].body.text()
    assert theme.DARK.code_background in code and theme.LIGHT.code_background not in code  # written again
    window.close()
    again = MainWindow(tmp_path, machine=MACHINE)
    qtbot.addWidget(again)
    assert theme.current() is theme.DARK and again.menus.actions["theme dark"].isChecked()
    again.menus.actions["theme system"].trigger()
    assert theme.current() is theme.LIGHT and again.settings.theme == "system"
    again.close()


def test_the_charts_follow_the_theme(qtbot, tmp_path):
    window = chat_window(qtbot, tmp_path)
    window.charts.add_step_stats(StepStats(0, tokens=4, seconds=0.1, hits=3, misses=1, bytes_fetched=100,
                                           prefetch_coverage=0.5, prefetch_waste=0.1))
    window.charts.refresh()
    plot = window.charts.plots["Decode speed"]
    assert plot.backgroundBrush().color() == QColor(theme.LIGHT.base)
    window.choose_theme("dark")
    assert plot.backgroundBrush().color() == QColor(theme.DARK.base)
    assert window.charts.curves["tok_s"].opts["pen"].color() == QColor(theme.DARK.series["tok_s"])
    assert plot.getAxis("left").textPen().color() == QColor(theme.DARK.text)
    window.choose_theme("light")
    window.close()


def test_no_widget_names_a_colour_of_its_own():
    """Every colour comes from app/ui/theme.py."""
    named = {path.name: COLOUR.findall(path.read_text()) for path in Path(app.ui.__file__).parent.glob("*.py")
             if path.name != "theme.py"}
    assert {name: found for name, found in named.items() if found} == {}
    assert not any("setStyleSheet" in path.read_text() for path in Path(app.ui.__file__).parent.glob("*.py")
                   if path.name != "theme.py")
