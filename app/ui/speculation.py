"""How the loaded model speculates: off, a DFlash drafter from a folder, or a GLM model's own MTP layer;
the block size chosen per step by the engine's cost-aware policy ("auto") or fixed."""

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.paths import DEMO_DRAFTER, DEMO_MODEL

METHODS = (("Off", "off"), ("DFlash drafter", "dflash"), ("MTP layer (GLM)", "mtp"))
AUTO = 0  # the block-size box's "auto": the engine picks the block size per step
MAX_BLOCK_SIZE = 32


class SpeculationPanel(QWidget):
    """The speculation part of a load request; the engine checks the pairing and answers in words.

    Signals: method_changed(method: str)."""

    method_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.method = QComboBox()
        for name, method in METHODS:
            self.method.addItem(name, method)
        self.method.currentIndexChanged.connect(self._show_fields)
        self.method.currentIndexChanged.connect(lambda _index: self.method_changed.emit(self.method.currentData()))
        self.drafter = QLineEdit()
        self.drafter.setPlaceholderText("the drafter's folder")
        self.browse_button = QPushButton("Choose…")
        self.browse_button.clicked.connect(self._choose_drafter)
        self.block_size = QSpinBox()
        self.block_size.setRange(AUTO, MAX_BLOCK_SIZE)
        self.block_size.setSpecialValueText("auto")
        self.note = QLabel("The drafter's memory comes out of the GPU budget (its slider then ends at twice "
                           "the target's whole plan); the plan above is the target's.")
        self.note.setWordWrap(True)
        self.note.setProperty("role", "muted")
        drafter_row = QHBoxLayout()
        drafter_row.addWidget(self.drafter, 1)
        drafter_row.addWidget(self.browse_button)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.form.addRow("Speculation", self.method)
        self.form.addRow("Drafter", drafter_row)
        self.form.addRow("Block size", self.block_size)
        self.form.addRow(self.note)
        self.show_model(None)

    def show_model(self, model_type: str | None, path: str | None = None) -> None:
        """Offer MTP only for GLM models (the ones with their own MTP layer). The bundled demo model comes
        with its drafter chosen; another model does not inherit it."""
        has_mtp = bool(model_type) and model_type.startswith("glm")
        self.method.model().item(self.method.findData("mtp")).setEnabled(has_mtp)
        if not has_mtp and self.method.currentData() == "mtp":
            self.method.setCurrentIndex(self.method.findData("off"))
        if path == str(DEMO_MODEL):
            self.drafter.setText(str(DEMO_DRAFTER))
            self.method.setCurrentIndex(self.method.findData("dflash"))
        elif self.drafter.text() == str(DEMO_DRAFTER):
            self.drafter.clear()
            self.method.setCurrentIndex(self.method.findData("off"))
        self._show_fields()

    def set_options(self, spec: str, drafter: str | None, block_size: int | None) -> None:
        """Show LoadModel's speculation fields (a method this model does not offer stays off)."""
        index = self.method.findData(spec)
        if index < 0 or not self.method.model().item(index).isEnabled():
            index = self.method.findData("off")
        self.drafter.setText(drafter or "")
        self.block_size.setValue(block_size or AUTO)
        self.method.setCurrentIndex(index)
        self._show_fields()

    def options(self) -> dict:
        """LoadModel's speculation fields."""
        method = self.method.currentData()
        if method == "off":
            return {"spec": "off", "drafter": None, "block_size": None}
        drafter = self.drafter.text().strip() if method == "dflash" else ""
        block_size = self.block_size.value()
        return {"spec": method, "drafter": drafter or None, "block_size": None if block_size == AUTO else block_size}

    def _show_fields(self) -> None:
        method = self.method.currentData()
        self.form.setRowVisible(1, method == "dflash")
        self.form.setRowVisible(2, method != "off")
        self.form.setRowVisible(3, method != "off")

    def _choose_drafter(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "The DFlash drafter's folder", self.drafter.text())
        if folder:
            self.drafter.setText(folder)
