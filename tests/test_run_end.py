"""A test run that is sent SIGTERM or SIGHUP, or is killed, leaves none of the processes its tests started running
(tests/fixtures/run_end.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.openai_server import process_gone, wait_until_gone
from tests.fixtures.run_end import end_with_test_run

ROOT = Path(__file__).parents[1]
# a test whose fixture starts a process that would outlive the run, as `moechat serve` would
CHILD_TEST = '''
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.run_end import end_with_test_run


@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], {options})
    yield process
    process.terminate()
    process.wait()


def test_waits(child):
    Path({pid_file!r}).write_text(str(child.pid))
    time.sleep(600)
'''


@pytest.mark.parametrize(("sent", "options"), [
    (signal.SIGTERM, ""), (signal.SIGHUP, ""), (signal.SIGKILL, "preexec_fn=end_with_test_run"),
], ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_an_ended_test_run_leaves_no_process_its_tests_started(tmp_path, sent, options):
    pid_file = tmp_path / "child.pid"
    test_file = tmp_path / "test_child.py"
    test_file.write_text(CHILD_TEST.format(options=options, pid_file=str(pid_file)))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                            str(test_file)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=end_with_test_run)
    child = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the inner test run never started its child"
            time.sleep(0.05)
        time.sleep(0.2)  # the pid is written: the test sleeps
        child = int(pid_file.read_text())
        run.send_signal(sent)
        run.wait(timeout=60)
        assert wait_until_gone(child), f"the test run ended on {sent.name} but left its child running"
    finally:
        run.kill()
        run.wait()
        if child is not None and not process_gone(child):  # the failure is reported; the child goes all the same
            os.kill(child, signal.SIGKILL)
