"""Screenshots of the main views for the README, taken from the real window under Xvfb.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python tools/screenshots.py docs/screenshots

The chat view shows a short sample conversation (stored in a scratch history) followed by a real
answer of the bundled demo model, speculating with its drafter, and the live charts of that run. The budget
panel plans gpt-oss-20b from its real tensor table for a stated machine (an RTX 4090 with 64 GiB of
RAM); the download panel talks to a local server that speaks the hub's protocol, then to one whose
connection drops. Every view is taken in the light theme (name.png) and the dark one (name-dark.png).
"""

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication

from app.chats import ChatStore
from app.ui.app_settings import AppSettings
from app.ui.hardware import GIB, Machine
from app.ui.main_window import MainWindow
from tests.fixtures.hub_server import FakeHub
from tests.fixtures.shape_only import write_shape_only_model
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tests.fixtures.tiny_tokenizer import write_harmony_tokenizer

MACHINE = Machine(ram_bytes=64 * GIB, gpu_name="NVIDIA GeForce RTX 4090", gpu_bytes=24 * GIB, pcie_gen=4)
CPU_ONLY = Machine(ram_bytes=16 * GIB)
THEMES = (("light", ""), ("dark", "-dark"))  # each view in both themes: name.png and name-dark.png
QUESTION = "How do I read the tensor names of a safetensors file without loading it?"
REASONING = ("The user wants the header only. A safetensors file starts with an 8-byte little-endian "
             "length, then that many bytes of JSON: names, dtypes, shapes and offsets.")
ANSWERS = [
    "Read the 8-byte header length, then the JSON header.",
    "The header is JSON behind an 8-byte length, so no weights are read:\n\n"
    "```python\nimport json, struct\n\n"
    "def tensor_names(path):\n"
    "    with open(path, \"rb\") as f:\n"
    "        (size,) = struct.unpack(\"<Q\", f.read(8))\n"
    "        header = json.loads(f.read(size))\n"
    "    return [name for name in header if name != \"__metadata__\"]\n```\n\n"
    "Each entry also has `dtype`, `shape` and `data_offsets`, which is how **MoE Chat** plans memory "
    "before loading anything.",
]


def wait(app: QApplication, condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not reach the state to photograph")
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)


def settle(app: QApplication) -> None:
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)


def sample_chat(store: ChatStore) -> int:
    chat = store.create_chat("Reading safetensors headers")
    question = store.add_message(chat, None, "user", QUESTION)
    for answer in ANSWERS:
        store.add_message(chat, question, "assistant", answer, reasoning=REASONING)
    return chat


def chat_views(app: QApplication, out: Path, scratch: Path, suffix: str) -> None:
    """The chat with the demo's real answer and the live charts, Markdown with folded reasoning, a killed engine."""
    store = ChatStore(scratch / "chats.sqlite")
    sample_chat(store)
    store.close()
    window = MainWindow(scratch, machine=CPU_ONLY)
    window.resize(1280, 800)
    window.show()
    budget = window.budget
    wait(app, lambda: budget.plan.facts is not None)  # the demo model, selected as no other is installed
    budget.load_button.click()
    wait(app, lambda: window.client.info is not None)

    window.chats.new_chat()
    window.chat_settings.max_tokens.setValue(160)
    window.chat_settings.temperature.setValue(0.0)
    window.chat.composer.setPlainText("What does `json.dumps` do?")
    window.chat.send()
    wait(app, lambda: window.chat.answer is None)
    window.show_live_charts()
    settle(app)
    window.grab().save(str(out / f"chat-live{suffix}.png"))

    window.chats.select(window.store.chats()[-1].id)
    window.chat.view.widgets[1].reasoning_toggle.setChecked(True)
    window.side_tabs.setCurrentIndex(0)
    settle(app)
    window.grab().save(str(out / f"chat-markdown{suffix}.png"))

    window.chat_settings.max_tokens.setValue(2000)
    window.chat.composer.setPlainText("Show me the source code of `textwrap.dedent`.")
    window.chat.send()

    def answer_is_long() -> bool:
        answer = window.chat.answer
        return answer is not None and len(answer.text + answer.reasoning) > 60

    wait(app, answer_is_long)
    os.kill(window.client.engine.process.pid, signal.SIGKILL)
    wait(app, lambda: window.banner.isVisible())
    settle(app)
    window.grab().save(str(out / f"engine-died{suffix}.png"))
    window.close()


def model_views(app: QApplication, out: Path, scratch: Path, tiny: Path, big: Path, suffix: str) -> None:
    """The library, a paused download and the budget panel planning gpt-oss-20b; a refused plan; a hub
    that cannot be reached."""
    files = {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}
    with FakeHub("tiny-org/tiny-gpt-oss", files, {n for n in files if n.endswith(".safetensors")}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        planner = MainWindow(scratch, machine=MACHINE)
        planner.resize(1280, 800)
        planner.show()
        planner.show_tab(1)
        planner.library.add_folder(str(tiny))
        planner.library.add_folder(str(big))
        planner.budget.gpu_slider.setValue(520)
        planner.budget.ram_slider.setValue(1000)
        downloads = planner.downloads
        downloads.look_up("tiny-org/tiny-gpt-oss")
        wait(app, lambda: downloads.job.download is not None and downloads.download_button.isEnabled())
        hub.delay_s = 0.02
        downloads.start()
        wait(app, lambda: hub.bytes_served > 150_000)
        downloads.pause()
        wait(app, lambda: not downloads.running)
        settle(app)
        planner.grab().save(str(out / f"models-budget{suffix}.png"))
        planner.budget.gpu_slider.setValue(150)
        settle(app)
        planner.budget.grab().save(str(out / f"plan-refused{suffix}.png"))
        hub.drop_after = 0  # the hub's connection drops: the look-up says so, with Retry and Cancel
        downloads.look_up("tiny-org/tiny-gpt-oss")
        wait(app, lambda: downloads.problem_row.isVisible())
        settle(app)
        downloads.grab().save(str(out / f"hub-error{suffix}.png"))
        planner.close()


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="moechat-screens-"))
    tiny = write_tiny_gpt_oss(scratch / "tiny-gpt-oss")
    write_harmony_tokenizer(tiny)
    big = write_shape_only_model(scratch / "gpt-oss-20b")
    app = QApplication(sys.argv)
    for theme, suffix in THEMES:
        data = scratch / theme
        AppSettings(data / "settings.json").set_theme(theme)
        AppSettings(data / "planner" / "settings.json").set_theme(theme)
        chat_views(app, out, data, suffix)
        model_views(app, out, data / "planner", tiny, big, suffix)
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
