"""tools/train_demo.py's count options: a count that is not a whole number above 0 gets one clear error."""

import pytest

from tools import train_demo


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
