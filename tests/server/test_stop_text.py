"""Stop strings over streamed text, split across pieces in every way."""

import pytest

from app.server.stop_text import StopText

TEXT = "the answer is 42. END and more"


@pytest.mark.parametrize("cut", range(1, len(TEXT)))
def test_the_text_before_the_first_stop_string_comes_out_whatever_the_pieces(cut):
    stop = StopText(["END", "never"])
    out = stop.feed(TEXT[:cut]) + stop.feed(TEXT[cut:]) + stop.finish()
    assert out == "the answer is 42. " and stop.stopped


def test_a_tail_that_may_begin_a_stop_string_is_held_back_then_released():
    stop = StopText(["ENDING"])
    assert stop.feed("ok EN") == "ok "
    assert stop.feed("D") == ""
    assert stop.feed("!") == "END!"
    assert stop.finish() == "" and not stop.stopped
    held = StopText(["ENDING"])
    assert held.feed("ok END") == "ok " and held.finish() == "END"  # the answer ended: nothing to wait for
