"""Live charts of the engine's figures (pyqtgraph), redrawn at ~10 Hz from ring buffers. A chart
appears once its series has data; pyqtgraph is imported then, not at start-up."""

import time

from PySide6.QtCore import QRectF, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.protocol.events import StepStats
from app.ui.live_stats import LiveStats
from app.ui.theme import Palette, current

REFRESH_MS = 100
LEGEND_ALPHA = 210
# title, y-axis unit, (series, legend name); each series' pen is the theme's
CHARTS = (
    ("Decode speed", "tok/s", (("tok_s", None),)),
    ("Expert-cache hit rate", "", (("hit_rate", None),)),
    ("Prefetch", "", (("prefetch_coverage", "coverage"), ("prefetch_waste", "waste"))),
    ("Fetched per token", "B", (("bytes_per_token", None),)),
    ("Experts the CPU computed per token", "", (("cpu_experts_per_token", None),)),
    ("Speculation per step", "tokens", (("accepted", "accepted drafts"), ("block_size", "block size"))),
)
FRACTIONS = ("hit_rate", "prefetch_coverage")
RESIDENCY = "Experts in the cache per layer"
ORDER = (*(title for title, _, _ in CHARTS), RESIDENCY)


class LiveCharts(QWidget):
    def __init__(self, clock=time.monotonic, parent: QWidget | None = None):
        super().__init__(parent)
        self.stats = LiveStats(clock)
        self.plots: dict[str, object] = {}  # chart title -> PlotWidget
        self.curves: dict[str, object] = {}  # series name -> PlotDataItem
        self.residency_image = None  # the heatmap's ImageItem, once residency figures arrive
        self.placeholder = QLabel("Charts appear here while the engine answers: speed, expert cache and its "
                                  "residency per layer, prefetch, and speculation when it is on.")
        self.placeholder.setWordWrap(True)
        self.column = QVBoxLayout(self)
        self.column.addWidget(self.placeholder)
        self.column.addStretch()
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()

    def add_step_stats(self, stats: StepStats) -> None:
        self.stats.add_step_stats(stats)

    def add_tokens(self, events: list) -> None:
        self.stats.add_tokens(events)

    def refresh(self) -> None:
        if not self.stats.changed:
            return
        self.stats.changed = False
        for title, unit, series in CHARTS:
            if not self.stats.has(series[0][0]):
                continue
            if title not in self.plots:
                self._add_plot(title, unit, series)
            for name, _ in series:
                self.curves[name].setData(*self.stats.points(name))
        if self.stats.residency[0]:
            self._show_residency()

    def _show_residency(self) -> None:
        """A layers × time image: one column per StepStats, the share of each layer's experts resident."""
        import numpy

        if RESIDENCY not in self.plots:
            self._add_residency_plot()
        times, rows = self.stats.residency
        image = numpy.array(rows, dtype=numpy.float32)  # [T, L]: pyqtgraph's x is the first axis
        self.residency_image.setImage(image, levels=(0.0, 1.0))
        start, end = times[0], times[-1]
        step = (end - start) / (len(times) - 1) if len(times) > 1 else 0.1
        self.residency_image.setRect(QRectF(start, 0, end - start + step, image.shape[1]))

    def _add_plot(self, title: str, unit: str, series) -> None:
        import pyqtgraph

        plot = self._new_plot(title, unit)
        plot.showGrid(x=True, y=True, alpha=0.2)
        if len(series) > 1:
            plot.addLegend(offset=(-10, 10))
        if series[0][0] in FRACTIONS:
            plot.setYRange(0, 1.05)
        for name, legend in series:
            self.curves[name] = plot.plot(pen=pyqtgraph.mkPen(current().series[name], width=2), name=legend)
        self._place(title, plot)
        self._style_plot(title, plot, current())

    def _add_residency_plot(self) -> None:
        import pyqtgraph

        plot = self._new_plot(RESIDENCY, "")
        plot.setLabel("left", "MoE layer")
        self.residency_image = pyqtgraph.ImageItem()
        self.residency_image.setColorMap(pyqtgraph.colormap.get("viridis"))
        plot.addItem(self.residency_image)
        bar = pyqtgraph.ColorBarItem(values=(0, 1), colorMap=pyqtgraph.colormap.get("viridis"), interactive=False,
                                     width=10)
        bar.setImageItem(self.residency_image, insert_in=plot.getPlotItem())
        self._place(RESIDENCY, plot)
        self._style_plot(RESIDENCY, plot, current())

    def follow_theme(self, palette: Palette) -> None:
        """Redraw every chart in `palette`'s colours."""
        if not self.plots:
            return
        import pyqtgraph

        for title, plot in self.plots.items():
            self._style_plot(title, plot, palette)
        for name, curve in self.curves.items():
            curve.setPen(pyqtgraph.mkPen(palette.series[name], width=2))

    @staticmethod
    def _style_plot(title: str, plot, palette: Palette) -> None:
        plot.setBackground(palette.base)
        plot.setTitle(title, color=palette.text)
        for side in ("left", "bottom"):
            axis = plot.getAxis(side)
            axis.setPen(palette.muted)
            axis.setTextPen(palette.text)
        legend = plot.getPlotItem().legend
        if legend is not None:
            fill = QColor(palette.base)
            fill.setAlpha(LEGEND_ALPHA)
            legend.setBrush(fill)
            legend.setLabelTextColor(palette.text)

    def _new_plot(self, title: str, unit: str):
        import pyqtgraph

        self.placeholder.hide()
        plot = pyqtgraph.PlotWidget()
        plot.setMinimumHeight(150)
        if unit:
            plot.setLabel("left", units=unit)
        plot.setLabel("bottom", "seconds")
        return plot

    def _place(self, title: str, plot) -> None:
        self.plots[title] = plot
        order = [t for t in ORDER if t in self.plots]  # the placeholder stays at 0, hidden
        self.column.insertWidget(1 + order.index(title), plot)
