"""Hub downloads in the window: look a repository up, check the disk, fetch with pause / resume /
cancel. The work runs in a thread (`DownloadJob`); partial files and the list of unfinished
downloads outlive the app, so a download resumes after a restart."""

import queue
import shutil
import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.errors import UserError, first_line
from app.hub import Download, Progress, parse_repo_id, write_manifest
from app.paths import model_folder_for
from app.sizes import format_size
from app.ui.app_settings import AppSettings

PROGRESS_INTERVAL_S = 0.1
DELIVERY_MS = 30  # how often a job's news from its thread is passed on
JOIN_S = 2.0  # at quit, how long a download's thread may take to stop
IDLE = "Download a model from the Hugging Face hub."


def time_left(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    if seconds < 90:
        return f"{seconds:.0f} s left"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min left"
    return f"{seconds / 3600:.1f} h left"


class DownloadJob(QObject):
    """One repository's download, worked in a thread. The thread never touches Qt: it queues what it has
    to say, and a timer of this object emits it in the thread the object lives in (a PySide signal emitted
    from a Python thread can crash the interpreter while the main thread collects garbage).

    Signals: listed(download: Download); progress(progress: Progress); finished(completed: bool), False
    when paused; failed(message: str)."""

    listed = Signal(object)
    progress = Signal(object)
    finished = Signal(bool)
    failed = Signal(str)

    def __init__(self, repo_id: str, folder: Path, revision: str = "main", parent: QObject | None = None):
        super().__init__(parent)
        self.repo_id, self.folder, self.revision = repo_id, folder, revision
        self.download: Download | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._last_report = 0.0
        self._said: queue.Queue = queue.Queue()  # (signal name, its arguments) from the thread
        self._timer = QTimer(self)
        self._timer.setInterval(DELIVERY_MS)
        self._timer.timeout.connect(self._deliver)

    def look_up(self) -> None:
        self._in_thread(self._look_up)

    def start(self) -> None:
        self.stop.clear()
        self._in_thread(self._run)

    def shut_down(self, timeout_s: float = JOIN_S) -> None:
        """Stop a running download (its partial files stay, to resume) and give its thread a moment to end."""
        self.stop.set()
        self._timer.stop()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def _in_thread(self, work) -> None:
        self.thread = threading.Thread(target=work, name=f"download {self.repo_id}", daemon=True)
        self.thread.start()
        self._timer.start()

    def _say(self, signal_name: str, *args) -> None:
        self._said.put((signal_name, args))

    def _deliver(self) -> None:
        while True:
            try:
                signal_name, args = self._said.get_nowait()
            except queue.Empty:
                break
            getattr(self, signal_name).emit(*args)
        if self.thread is not None and not self.thread.is_alive() and self._said.empty():
            self._timer.stop()

    def _look_up(self) -> None:
        try:
            self.download = Download(self.repo_id, self.folder, self.revision)
        except UserError as error:
            self._say("failed", str(error))
            return
        except Exception as error:  # a worker that dies would leave "Looking up…" on screen for ever
            self._say("failed", f"Looking up {self.repo_id} failed: {first_line(error)}")
            return
        self._say("listed", self.download)

    def _run(self) -> None:
        try:
            completed = self.download.run(self._report, self.stop)
            if completed:
                write_manifest(self.download)
        except UserError as error:
            self._say("failed", str(error))
            return
        except Exception as error:  # as in _look_up: the panel must hear of it
            self._say("failed", f"Downloading {self.repo_id} failed: {first_line(error)}")
            return
        self._say("finished", completed)

    def _report(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._last_report >= PROGRESS_INTERVAL_S or progress.done == progress.total:
            self._last_report = now
            self._say("progress", progress)


class DownloadPanel(QWidget):
    """A failed look-up or download is one sentence with Retry (look up again, or resume) and Cancel (back
    to the start, or leave the download paused).

    Signals: model_downloaded(folder: str)."""

    model_downloaded = Signal(str)

    def __init__(self, settings: AppSettings, models_dir: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings, self.models_dir = settings, models_dir
        self.job: DownloadJob | None = None
        self.running = False
        self._cancelling = False
        self.repo = QLineEdit()
        self.repo.setPlaceholderText("openai/gpt-oss-20b or https://huggingface.co/…")
        self.repo.returnPressed.connect(self.look_up)
        self.look_up_button = QPushButton("Look up")
        self.look_up_button.clicked.connect(self.look_up)
        self.summary = QLabel(IDLE)
        self.summary.setWordWrap(True)
        self.files = QTableWidget(0, 3)
        self.files.setHorizontalHeaderLabels(["File", "Size", "Have"])
        self.files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.files.verticalHeader().hide()
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.start)
        self.pause_button = QPushButton("Pause")
        self.pause_button.clicked.connect(self.pause)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setProperty("role", "error")
        self.retry_button = QPushButton("Retry")
        self.retry_button.clicked.connect(self.retry)
        self.dismiss_button = QPushButton("Cancel")
        self.dismiss_button.clicked.connect(self.dismiss)
        self.problem_row = QWidget()
        problem_layout = QHBoxLayout(self.problem_row)
        problem_layout.setContentsMargins(0, 0, 0, 0)
        problem_layout.addWidget(self.problem, 1)
        problem_layout.addWidget(self.retry_button)
        problem_layout.addWidget(self.dismiss_button)
        self.problem_row.hide()
        self._retry = self.look_up

        ask = QHBoxLayout()
        ask.addWidget(self.repo)
        ask.addWidget(self.look_up_button)
        buttons = QHBoxLayout()
        for button in (self.download_button, self.pause_button, self.cancel_button):
            buttons.addWidget(button)
        buttons.addStretch()
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("<b>Download from the hub</b>"))
        layout.addLayout(ask)
        for widget in (self.summary, self.problem_row, self.files, self.bar, self.status):
            layout.addWidget(widget)
        layout.addLayout(buttons)
        self._show_buttons(running=False, ready=False)
        if settings.downloads:
            unfinished = settings.downloads[0]
            self.repo.setText(unfinished["repo_id"])
            self.status.setText(f"Unfinished download of {unfinished['repo_id']}: look it up to resume.")

    def look_up(self, repo_text: str | None = None) -> None:
        if repo_text:
            self.repo.setText(repo_text)
        try:
            repo_id = parse_repo_id(self.repo.text())
        except UserError as error:
            self.status.setText(str(error))
            return
        if self.job is not None:
            self.job.deleteLater()  # its thread, if still looking, only queues what it finds
        self.job = DownloadJob(repo_id, self.models_dir / model_folder_for(repo_id).name, parent=self)
        self.job.listed.connect(self._show_listing)
        self.job.progress.connect(self._show_progress)
        self.job.finished.connect(self._on_finished)
        self.job.failed.connect(self._on_failed)
        self.problem_row.hide()
        self.bar.setValue(0)
        self.status.clear()
        self.summary.setText(f"Looking up {repo_id}…")
        self.files.setRowCount(0)
        self._show_buttons(running=False, ready=False)
        self.job.look_up()

    def start(self) -> None:
        download = self.job.download
        try:
            download.check_disk_space()
        except UserError as error:
            self.status.setText(str(error))
            return
        self.settings.remember_download(download.repo_id, download.revision, str(download.folder))
        self.problem_row.hide()
        self.status.setText("Starting…")
        self._set_running(True)
        self.job.start()

    def pause(self) -> None:
        self.job.stop.set()

    def retry(self) -> None:
        self.problem_row.hide()
        self._retry()

    def dismiss(self) -> None:
        """Cancel on a failure: a failed look-up is forgotten; a failed download stays paused, to resume."""
        self.problem_row.hide()
        if self.job is not None and self.job.download is None:
            self.job = None
            self.summary.setText(IDLE)
            self._show_buttons(running=False, ready=False)

    def shut_down(self) -> None:
        if self.job is not None:
            self.job.shut_down()

    def cancel(self) -> None:
        """Stop and forget the partial files (once the thread has let go of them)."""
        if self.running:
            self._cancelling = True
            self.job.stop.set()
            return
        self.job.download.cancel()
        self.settings.forget_download(str(self.job.download.folder))
        self._cancelling = False
        self.bar.setValue(0)
        self.download_button.setText("Download")
        self.status.setText("Cancelled; the partial files were deleted.")

    def _show_listing(self, download: Download) -> None:
        self.files.setRowCount(len(download.files))
        for row, remote in enumerate(download.files):
            have = download.bytes_present(remote)
            for column, text in enumerate((remote.path, format_size(remote.size),
                                           "all" if have == remote.size else format_size(have))):
                self.files.setItem(row, column, QTableWidgetItem(text))
        missing = download.missing_bytes()
        try:
            download.check_disk_space()
            room = ""
        except UserError as error:
            room = str(error)
        self.summary.setText(
            f"<b>{download.repo_id}</b> @ {download.commit[:10]}: {len(download.files)} files, "
            f"{format_size(download.total_bytes)}; {format_size(missing)} to fetch, "
            f"{format_size(shutil.disk_usage(download.folder).free)} free"
        )
        self.bar.setValue(self._fraction(download.total_bytes - missing, download.total_bytes))
        self.status.setText(room or ("Complete." if missing == 0 else ""))
        self.download_button.setText("Resume" if 0 < missing < download.total_bytes else "Download")
        self._show_buttons(running=False, ready=not room and missing > 0)

    def _show_progress(self, progress: Progress) -> None:
        self.bar.setValue(self._fraction(progress.done, progress.total))
        self.status.setText(
            f"{progress.file}: {format_size(progress.file_done)} of {format_size(progress.file_size)} · "
            f"{format_size(progress.done)} of {format_size(progress.total)} · "
            f"{format_size(progress.speed_bps)}/s · {time_left(progress.eta_s)}"
        )

    def _on_finished(self, completed: bool) -> None:
        folder = str(self.job.download.folder)
        self._set_running(False)
        if self._cancelling:
            self.cancel()
            return
        if not completed:
            self.download_button.setText("Resume")
            self.status.setText("Paused: the partial files are kept; Resume continues where it stopped.")
            return
        self.settings.forget_download(folder)
        self.bar.setValue(1000)
        self.status.setText(f"Done: {folder}")
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(False)
        self.model_downloaded.emit(folder)

    def _on_failed(self, message: str) -> None:
        self._set_running(False)
        if self._cancelling:
            self.cancel()
            return
        looked_up = self.job.download is not None
        self._retry = self.start if looked_up else self.look_up
        self.problem.setText(message)
        self.problem_row.show()
        if looked_up:
            self.download_button.setText("Resume")
            self.status.setText("Stopped: the partial files are kept.")
        else:
            self.summary.setText(f"Could not look up {self.job.repo_id}.")

    def _set_running(self, running: bool) -> None:
        self.running = running
        self.look_up_button.setEnabled(not running)
        self.repo.setEnabled(not running)
        self._show_buttons(running, ready=self.job is not None and self.job.download is not None)

    def _show_buttons(self, running: bool, ready: bool) -> None:
        self.download_button.setEnabled(ready and not running)
        self.pause_button.setEnabled(running)
        self.cancel_button.setEnabled(ready)

    @staticmethod
    def _fraction(done: int, total: int) -> int:
        return 1000 * done // total if total else 0
