"""Every bad flag or model folder the `moechat` command is given ends as one line on stderr and a non-zero
exit, never a traceback: out-of-range sampling values, ports, sizes, unreadable files, malformed configs."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from app.cli import main
from tests import test_hub

hub = test_hub.hub  # a fake hub serving test_hub's files
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def model_copy(tiny_gpt_oss, tmp_path):
    return shutil.copytree(tiny_gpt_oss, tmp_path / "model")


def one_line_error(capsys, *args) -> str:
    """Run the command; it must fail with exactly one line on stderr (argparse exits, UserErrors return)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code not in (0, None), captured
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--temperature", "nan"], "nan is not a temperature this engine samples at: use 0 (greedy) or 0.001 … 2"),
    (["--temperature", "1e-45"], "1e-45 is not a temperature"),
    (["--temperature", "inf"], "inf is not a temperature"),
    (["--temperature", "-1"], "-1.0 is not a temperature"),
    (["--temperature", "hot"], "'hot' is not a number"),
    (["--top-p", "0"], "0.0 is not a top-p: use a share of the probability mass above 0 and at most 1"),
    (["--top-p", "nan"], "nan is not a top-p"),
    (["--top-p", "1.5"], "1.5 is not a top-p"),
    (["--top-k", "-3"], "-3 is not a top-k"),
    (["--seed", str(1 << 64)], f"{1 << 64} is not a seed: use a whole number from 0 to 2^64 - 1"),
    (["--seed", "-1"], "-1 is not a seed"),
    (["--seed", "1.5"], "'1.5' is not a whole number"),
    (["--gpu-budget", "9" * 400], "is too large to be a number of bytes"),
    (["--system", "\udcff"], "argument --system: the text is not valid Unicode: a lone surrogate ('\\udcff') at "
                              "character 0"),  # how Python reads an argument's bytes that are not UTF-8
    (["--max-new-tokens", "99999999999999"], "--max-new-tokens 99999999999999 is more than this model's context "
                                             "(131072 tokens, max_position_embeddings in config.json)"),
])
def test_out_of_range_generate_flags_are_one_line(tiny_gpt_oss, capsys, flags, message):
    line = one_line_error(capsys, "generate", tiny_gpt_oss, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", *flags)
    assert line.startswith("moechat")
    assert message in line


@pytest.mark.parametrize(("flags", "message"), [
    (["--port", "70000"], "argument --port: '70000' is not a whole number from 1 to 65535"),
    (["--port", "0"], "'0' is not a whole number from 1 to 65535"),
    (["--max-queue", "-1"], "argument --max-queue: '-1' is not a whole number from 0"),
    (["--engine-timeout", "nan"], "'nan' is not a number of seconds above 0"),
    (["--context", "200000"], "--context 200000 is more than this model's context (131072 tokens"),
    (["--api-key", "a", "--api-key-file", "k"], "give the key once: --api-key or --api-key-file, not both"),
    (["--api-key-file", "/nowhere/key"], "cannot read the key file '/nowhere/key': No such file or directory"),
])
def test_out_of_range_serve_flags_are_one_line(tiny_gpt_oss, capsys, flags, message):
    assert message in one_line_error(capsys, "serve", tiny_gpt_oss, *flags)


def test_an_empty_key_file_is_refused(tiny_gpt_oss, capsys, tmp_path):
    (tmp_path / "key").write_text("\n")
    assert one_line_error(capsys, "serve", tiny_gpt_oss, "--api-key-file", tmp_path / "key") == \
        "moechat: error: the API key is empty: give a key of at least one character"


@pytest.mark.parametrize("command", ["generate", "serve", "plan"])
@pytest.mark.parametrize("threads", ["-1", str(os.cpu_count() + 1), "two"])
def test_cpu_threads_past_the_machines_cores_are_one_line(tiny_gpt_oss, capsys, command, threads):
    from app.plan_cpu_tier import host_cores

    more = {"generate": ["--prompt-ids", "1,2"], "serve": [], "plan": ["--gpu-budget", "1G", "--ram-budget", "1G"]}
    line = one_line_error(capsys, command, tiny_gpt_oss, *more[command], "--cpu-threads", threads)
    assert f"argument --cpu-threads: '{threads}' is not a whole number from 0 to {host_cores()} (the cores of this " \
           "machine)" in line


def test_plan_refuses_a_memory_bandwidth_of_zero(tiny_gpt_oss, capsys):
    line = one_line_error(capsys, "plan", tiny_gpt_oss, "--gpu-budget", "1G", "--ram-budget", "1G",
                          "--memory-bandwidth", "0")
    assert "argument --memory-bandwidth: '0' is not a size above 0" in line


def write_header(folder, header) -> None:
    """Replace the checkpoint by one safetensors file with this JSON header (and a few bytes of data)."""
    (folder / "model.safetensors.index.json").unlink()
    for shard in folder.glob("*.safetensors"):
        shard.unlink()
    data = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(data)) + data + bytes(16))


def edit_config(folder, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))


def unreadable(path) -> None:
    """A file that is there but cannot be read, even by root (as the tests may run): /proc/self/mem
    answers a read at offset 0 with EIO."""
    path.unlink()
    path.symlink_to("/proc/self/mem")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: (f / "config.json").write_text("[1, 2]"),
     r"config\.json holds a JSON list where an object \{\.\.\.\} belongs"),
    (lambda f: edit_config(f, lambda c: {k: v for k, v in c.items() if k != "hidden_size"}),
     "lacks the key 'hidden_size'"),
    (lambda f: edit_config(f, lambda c: {**c, "num_hidden_layers": "four"}),
     "has a value of the wrong type|'num_hidden_layers' expected int, got str"),  # plan's words | the tokenizer's
    (lambda f: (f / "generation_config.json").write_text("[1]"), "generation_config.json holds a JSON list"),
    (lambda f: (f / "model.safetensors.index.json").write_text("[1]"),
     "model.safetensors.index.json holds a JSON list"),
    (lambda f: (f / "model.safetensors.index.json").write_text('{"weight_map": [1]}'),
     "is not a table of tensor names to files"),
    (lambda f: write_header(f, [1]), "has a corrupt header"),
    (lambda f: write_header(f, {"x": {"dtype": "F32", "shape": [1]}}), "tensor 'x' in model.safetensors has a "
                                                                        "malformed header entry"),
    (lambda f: write_header(f, {"x": {"dtype": "F32", "shape": "ab", "data_offsets": [0, 4]}}),
     "malformed header entry"),
    (lambda f: unreadable(f / "config.json"), "cannot read"),
    (lambda f: unreadable(f / SHARD), "cannot read"),
])
def test_a_malformed_or_unreadable_model_folder_is_one_line(model_copy, capsys, damage, message):
    damage(model_copy)
    for command in (["generate", model_copy, "--prompt-ids", "1,2,3"],
                    ["plan", model_copy, "--gpu-budget", "1G", "--ram-budget", "1G"]):
        line = one_line_error(capsys, *command)
        assert line.startswith("moechat: error: ") and re.search(message, line), line


def test_a_file_given_as_the_model_folder_is_named_as_a_file(tmp_path, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert one_line_error(capsys, "generate", tmp_path / "model.safetensors", "--prompt", "hi") == \
        f"moechat: error: '{tmp_path / 'model.safetensors'}' is a file: give the model's folder (the one holding " \
        "config.json)"


def test_a_download_folder_that_is_a_file_is_one_line(tmp_path, monkeypatch, hub):
    (tmp_path / "taken").write_text("a file where the folder should go")
    result = subprocess.run([sys.executable, "-m", "app", "download", "tiny-org/tiny-model", "--dir",
                             str(tmp_path / "taken")], capture_output=True, text=True, timeout=120,
                            env={**os.environ})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == \
        f"moechat: error: cannot make the download folder {tmp_path / 'taken'}: File exists"
    assert "Traceback" not in result.stderr


def test_a_prompt_whose_bytes_are_not_utf8_is_one_line(tiny_gpt_oss):
    result = subprocess.run([sys.executable, "-m", "app", "generate", str(tiny_gpt_oss), "--prompt", b"caf\xe9"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "moechat generate: error: argument --prompt: the text is not valid Unicode: a lone surrogate ('\\udce9') at "
        "character 3 (see moechat generate --help)"]
