"""tools/train_demo.py's options: a count that is not a whole number above 0, a target width that MXFP4 cannot
store, or a new target's width for a target trained before, each gets one clear error."""

import re

import pytest

from tools import train_demo
from tools.train_demo import main


def test_a_count_option_takes_a_whole_number_above_zero():
    args = train_demo._parser().parse_args(["--drafter-anchors", "32", "--drafter-batch", "256"])
    assert (args.drafter_anchors, args.drafter_batch) == (32, 256)


@pytest.mark.parametrize("value", ["0", "-4", "1.5", "many"])
def test_a_bad_count_is_one_clear_error(value, capsys):
    with pytest.raises(SystemExit):
        train_demo._parser().parse_args(["--drafter-anchors", value])
    error = capsys.readouterr().err
    assert f"argument --drafter-anchors: {value!r} is not a count: give a whole number above 0" in error
    assert "Traceback" not in error


@pytest.mark.parametrize(("options", "message"), [
    (["--target-hidden", "100"], "--target-hidden 100: give a multiple of 32 (the width of an MXFP4 group)"),
    (["--target-hidden", "96", "--target-from", "somewhere"],
     "--target-hidden sizes a new target, and --target-from trains a drafter for one trained before"),
])
def test_a_target_width_that_cannot_be_trained_is_one_clear_error(options, message, tmp_path):
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["--smoke", "--out", str(tmp_path), *options])
    assert not any(tmp_path.iterdir())  # refused before any work
