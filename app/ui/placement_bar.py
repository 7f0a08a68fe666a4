"""Two stacked bars: what the plan puts on the compute device and what it puts in RAM / on disk."""

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QWidget

from app.plan import Placement
from app.sizes import format_size
from app.ui.theme import current

ROW_HEIGHT = 26
LABEL_WIDTH = 70


def device_segments(placement: Placement, budget: int) -> list[tuple[str, int]]:
    return [("resident weights", placement.resident_bytes), ("KV cache", placement.kv_cache_bytes),
            ("workspace", placement.workspace_bytes), ("expert slots", placement.slot_bytes),
            ("unused budget", max(budget - placement.device_bytes, 0))]


def host_segments(placement: Placement) -> list[tuple[str, int]]:
    return [("pinned RAM experts", placement.host_bytes), ("on disk", placement.disk_bytes)]


class PlacementBar(QWidget):
    """The device row is drawn to the scale of the budget slider's end; the RAM row to all experts."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.rows: list[tuple[str, list[tuple[str, int]], int]] = []
        self.setMinimumHeight(2 * ROW_HEIGHT + 70)

    def sizeHint(self) -> QSize:
        return QSize(480, self.minimumHeight())

    def show_placement(self, placement: Placement, device_label: str, budget: int, scale: int) -> None:
        self._show([(device_label, placement, budget, scale)])

    def show_gpus(self, gpus: tuple[Placement, ...], budgets: tuple[int, ...], scales: list[int]) -> None:
        """A row per GPU of an expert-parallel plan (each to its own slider's scale), then RAM / disk."""
        self._show([(f"GPU {i}", *row) for i, row in enumerate(zip(gpus, budgets, scales, strict=True))])

    def _show(self, devices: list[tuple[str, Placement, int, int]]) -> None:
        """devices: (label, placement, budget, scale) per device row; the host row is the first placement's."""
        self.rows = []
        for label, placement, budget, scale in devices:
            segments = device_segments(placement, budget)
            self.rows.append((label, segments, max(scale, sum(size for _, size in segments))))
        host = host_segments(devices[0][1])
        self.rows.append(("RAM / disk", host, sum(size for _, size in host)))
        self.setMinimumHeight(len(self.rows) * (ROW_HEIGHT + 8) + 54)
        self.setToolTip("\n".join(f"{label} {name}: {format_size(size)}" for label, segments, _ in self.rows
                                  for name, size in segments))
        self.update()

    def paintEvent(self, event) -> None:
        colours = current().placement
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        width = self.width() - LABEL_WIDTH - 4
        y = 2
        used_names: list[str] = []
        for label, segments, capacity in self.rows:
            painter.setPen(self.palette().text().color())
            painter.drawText(QRectF(0, y, LABEL_WIDTH, ROW_HEIGHT), Qt.AlignmentFlag.AlignVCenter, label)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(colours["free"]))
            painter.drawRoundedRect(QRectF(LABEL_WIDTH, y, width, ROW_HEIGHT), 4, 4)
            x = float(LABEL_WIDTH)
            for name, size in segments:
                span = width * size / capacity if capacity else 0
                if span > 0:
                    painter.setBrush(QColor(colours[name]))
                    painter.drawRect(QRectF(x, y, span, ROW_HEIGHT))
                    used_names.append(name)
                x += span
            y += ROW_HEIGHT + 8
        x = float(LABEL_WIDTH)
        for name in dict.fromkeys(used_names):
            text_width = painter.fontMetrics().horizontalAdvance(name) + 22
            if x + text_width > self.width():
                x, y = float(LABEL_WIDTH), y + 20
            painter.setBrush(QColor(colours[name]))
            painter.setPen(Qt.PenStyle.NoPen)
            painter.drawRect(QRectF(x, y + 4, 10, 10))
            painter.setPen(self.palette().text().color())
            painter.drawText(QRectF(x + 14, y, text_width, 18), Qt.AlignmentFlag.AlignVCenter, name)
            x += text_width
        painter.end()
