"""How long the desktop window takes to open with no model loaded (the target is under 2 s).

    python bench/ui_startup.py [--runs 5]

Each run is a fresh Python process (cold imports, an empty data folder); the clock starts before
PySide6 is imported and stops when the window has been exposed and painted. Writes
bench/results/ui-startup-<date>.json with every run, the median and the machine.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 2.0


def one_run(data_dir: str) -> dict:
    started = time.perf_counter()
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv)
    from app.ui.main_window import MainWindow

    imported = time.perf_counter()
    window = MainWindow(Path(data_dir))
    built = time.perf_counter()
    window.show()
    QTest.qWaitForWindowExposed(window, 10_000)
    app.processEvents()
    shown = time.perf_counter()
    result = {"imports_s": imported - started, "build_s": built - imported, "show_s": shown - built,
              "window_open_s": shown - started, "torch_loaded": "torch" in sys.modules,
              "qt_platform": app.platformName()}
    window.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child)))
        return
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as data_dir:
            child = subprocess.run([sys.executable, __file__, "--child", data_dir], cwd=ROOT, capture_output=True,
                                   text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    median = statistics.median(run["window_open_s"] for run in runs)
    import PySide6

    report = {
        "name": "ui-startup",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "pyside6": PySide6.__version__, "qt_platform": runs[0]["qt_platform"]},
        "target_s": TARGET_S,
        "median_window_open_s": median,
        "runs": runs,
    }
    out = ROOT / "bench" / "results" / f"ui-startup-{date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"window open: median {median:.2f} s over {len(runs)} runs (target < {TARGET_S} s) -> {out}")


if __name__ == "__main__":
    main()
