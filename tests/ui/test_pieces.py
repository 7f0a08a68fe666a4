"""The UI's parts without an engine: conversation bookkeeping, Markdown, live series, hardware."""

import os
import subprocess

import pytest

from app.answer_figures import stats_line
from app.chats import ChatStore
from app.plan_cpu import CPU_HARDWARE
from app.protocol.events import Done, SpecStep, StepStats, Tokens
from app.protocol.kinds import StopReason
from app.protocol.stats import CacheStats, GenerationStats, SpecStats
from app.ui.charts import RESIDENCY, LiveCharts
from app.ui.conversation import Answer, engine_messages, title_for
from app.ui.hardware import GIB, Machine, detect_machine, total_ram
from app.ui.live_stats import LiveStats
from app.ui.message_html import markdown_html


@pytest.fixture
def store(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    yield store
    store.close()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_an_answer_is_stored_from_the_start_and_keeps_its_text_when_interrupted(store):
    chat = store.create_chat("t")
    question = store.add_message(chat, None, "user", "hi")
    clock = Clock()
    answer = Answer(store, chat, question, request_id=3, clock=clock)
    assert store.message(answer.message_id).complete is False
    clock.now += 0.5
    answer.add([Tokens([1], [("reasoning", "let me think")], 3), Tokens([2, 3], [("answer", "Hel")], 3)])
    clock.now += 1.0
    answer.add([Tokens([4], [("answer", "lo")], 3)])
    stats = answer.interrupt("the engine was killed (out of memory?)")
    stored = store.message(answer.message_id)
    assert (stored.content, stored.reasoning, stored.complete) == ("Hello", "let me think", False)
    assert stats == stored.stats
    assert stats["tokens"] == 4 and stats["ttft_s"] == pytest.approx(0.5) and stats["tok_s"] == pytest.approx(3.0)
    assert stats["stop_reason"] == "the engine was killed (out of memory?)"


def test_a_finished_answer_takes_the_engines_figures(store):
    chat = store.create_chat("t")
    answer = Answer(store, chat, store.add_message(chat, None, "user", "hi"), request_id=1)
    answer.add([Tokens([1], [("answer", "ok")], 1)])
    spec = SpecStats("fixed", 2, [4, 4], [2, 3], 2.5)
    answer.finish(Done(StopReason.STOP, GenerationStats(5, 0, 0.1, 42.0, CacheStats(), spec), 1))
    stored = store.message(answer.message_id)
    assert stored.complete and stored.stats == {"stop_reason": "stop", "tokens": 1, "context_tokens": 6,
                                                "tok_s": 42.0, "ttft_s": 0.1, "mean_accepted": 2.5}
    stopped = Answer(store, chat, stored.parent_id, request_id=2)
    stopped.finish(Done(StopReason.CANCELLED, None, 2))
    assert not store.message(stopped.message_id).complete


def test_the_engine_gets_the_branch_up_to_the_question_with_the_system_prompt(store):
    chat = store.create_chat("t")
    first = store.add_message(chat, None, "user", "one")
    reply = store.add_message(chat, first, "assistant", "two", reasoning="hidden")
    store.add_message(chat, first, "assistant", "another two")  # a sibling, not on the path
    question = store.add_message(chat, reply, "user", "three")
    assert engine_messages(store, question, "be brief") == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"},
    ]
    assert engine_messages(store, first, "  ")[0] == {"role": "user", "content": "one"}


def test_titles_are_the_first_words():
    assert title_for("  Why is\nthe sky blue? ") == "Why is the sky blue?"
    assert len(title_for("word " * 30)) == 40 and title_for("word " * 30).endswith("…")


def test_markdown_renders_code_blocks_with_copy_links_and_escapes_html():
    html, blocks = markdown_html("Try **this**:\n\n```python\nprint('<hi>')\n```\n\n<script>x</script>\x0b")
    assert "<strong>this</strong>" in html and 'href="copy:0"' in html and ">python<" in html
    assert "&lt;script&gt;" in html and "<script>" not in html and "\x0b" not in html
    assert blocks == ["print('<hi>')\n"]


def test_the_stats_line_reads_like_a_sentence():
    line = stats_line({"tok_s": 31.25, "ttft_s": 0.2, "tokens": 12, "mean_accepted": 2.0, "stop_reason": "length"})
    assert line == "31.2 tok/s · first token 0.20 s · 12 tokens · 2.00 accepted per step · max tokens reached"


def test_live_stats_keep_a_series_only_for_figures_that_exist():
    clock = Clock()
    stats = LiveStats(clock)
    stats.add_step_stats(StepStats(1, tokens=5, seconds=0.5, hits=3, misses=1, bytes_fetched=1000,
                                   prefetch_coverage=0.0, prefetch_waste=0.0))
    clock.now += 0.1
    stats.add_step_stats(StepStats(1, tokens=2, seconds=0.1, hits=0, misses=0, bytes_fetched=0,
                                   prefetch_coverage=0.5, prefetch_waste=0.25))
    assert stats.points("tok_s") == ([0.0, pytest.approx(0.1)], [10.0, 20.0])
    assert stats.points("hit_rate") == ([0.0], [0.75])
    assert stats.points("bytes_per_token")[1] == [200.0, 0.0]
    assert stats.points("prefetch_coverage")[1] == [0.5] and stats.points("prefetch_waste")[1] == [0.25]
    assert not stats.has("accepted")


def test_the_cpu_tiers_experts_per_token_are_charted_from_the_first_it_computed(qtbot):
    clock = Clock()
    charts = LiveCharts(clock)
    qtbot.addWidget(charts)
    for computed in (0, 6, 0):
        charts.add_step_stats(StepStats(1, tokens=4, seconds=0.1, hits=3, misses=9, bytes_fetched=0,
                                        prefetch_coverage=0.0, prefetch_waste=0.0, cpu_computed=computed))
        charts.refresh()
        clock.now += 0.1
    assert charts.stats.points("cpu_experts_per_token")[1] == [1.5, 0.0]
    assert list(charts.curves["cpu_experts_per_token"].getData()[1]) == [1.5, 0.0]
    assert list(charts.plots).index("Experts the CPU computed per token") == 3


def test_ram_is_read_from_the_kernel():
    assert total_ram() == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), rel=0.01)


def test_a_gpu_is_found_through_nvidia_smi():
    def smi(args, **_):
        assert args[0] == "nvidia-smi"
        return subprocess.CompletedProcess(args, 0, "NVIDIA H200, 143771, 5\nNVIDIA H200, 143771, 5\n", "")

    machine = detect_machine(run=smi)
    assert (machine.gpu_name, machine.gpu_bytes, machine.pcie_gen) == ("NVIDIA H200", 143771 << 20, 5)
    assert machine.device == "cuda" and machine.dtype == "bfloat16" and machine.device_bytes == 143771 << 20
    assert machine.hardware.link_bps == 55e9 and machine.hardware.memory_bps == 4.8e12
    assert machine.cores == len(os.sched_getaffinity(0))  # the cores the app may run on


def test_without_nvidia_smi_the_cpu_is_the_device():
    def missing(args, **_):
        raise FileNotFoundError(args[0])

    machine = detect_machine(run=missing)
    assert machine.gpu_bytes is None and machine.device == "cpu" and machine.device_bytes == machine.ram_bytes
    assert machine.hardware == CPU_HARDWARE
    assert "no NVIDIA GPU" in Machine(16 * GIB).describe()


def spec_step(accepted: int, block_size: int, request_id: int = 1) -> Tokens:
    """A speculative step's Tokens event as the engine sends it (`spec` says what the step verified)."""
    return Tokens(list(range(accepted + 1)), [("answer", "x" * (accepted + 1))], request_id,
                  [i < accepted for i in range(accepted + 1)], SpecStep(block_size, accepted, 1.0, 0, 0, 0, 0.0, 0.0))


def test_speculative_steps_give_accepted_drafts_and_block_sizes(store):
    stats = LiveStats(Clock())
    stats.add_tokens([Tokens([1], [("answer", "a")], 1), spec_step(3, 8), spec_step(1, 4)])
    assert stats.points("accepted")[1] == [3, 1] and stats.points("block_size")[1] == [8, 4]
    chat = store.create_chat("t")
    answer = Answer(store, chat, store.add_message(chat, None, "user", "hi"), request_id=1)
    answer.add([spec_step(3, 8), spec_step(1, 4)])
    assert answer.tokens == 6 and answer.text == "xxxxxx"
    assert answer.interrupt("cancelled")["mean_accepted"] == 2.0


def test_charts_appear_only_for_figures_that_have_data(qtbot):
    charts = LiveCharts(Clock())
    qtbot.addWidget(charts)
    charts.refresh()
    assert charts.plots == {} and not charts.placeholder.isHidden()
    charts.add_step_stats(StepStats(1, tokens=4, seconds=0.1, hits=3, misses=1, bytes_fetched=4096,
                                    prefetch_coverage=0.0, prefetch_waste=0.0))
    charts.refresh()
    assert list(charts.plots) == ["Decode speed", "Expert-cache hit rate", "Fetched per token"]
    assert charts.placeholder.isHidden()
    charts.add_tokens([spec_step(2, 4)])
    charts.refresh()
    assert "Speculation per step" in charts.plots and "Prefetch" not in charts.plots
    assert list(charts.curves["block_size"].getData()[1]) == [4]


def test_the_residency_heatmap_shows_each_layers_share_over_time(qtbot):
    clock = Clock()
    charts = LiveCharts(clock)
    qtbot.addWidget(charts)
    for residency in ([0.5, 1.0, 0.0], [0.75, 1.0, 0.25]):
        charts.add_step_stats(StepStats(1, tokens=4, seconds=0.1, hits=3, misses=1, bytes_fetched=0,
                                        prefetch_coverage=0.0, prefetch_waste=0.0, residency=residency))
        clock.now += 0.1
    charts.refresh()
    assert list(charts.plots)[-1] == RESIDENCY
    assert charts.residency_image.image.tolist() == [[0.5, 1.0, 0.0], [0.75, 1.0, 0.25]]  # [time, layer]
    assert charts.residency_image.mapRectToParent(charts.residency_image.boundingRect()).height() == 3
