"""The words of the contract: what each stop reason means to the app, to the OpenAI API and in the chat."""

import json

from app.protocol.kinds import PieceKind, StopReason


def test_stop_reasons_as_the_app_and_the_openai_api_read_them():
    assert [reason for reason in StopReason if reason.finished] == ["stop", "length", "context"]
    assert {reason: reason.finish_reason for reason in StopReason} == {
        "stop": "stop", "length": "length", "context": "length", "cancelled": "stop",
        "content_filter": "content_filter"}
    assert [StopReason.from_finish_reason(word) for word in ("stop", "length", None, "content_filter", "tool_calls")] \
        == [StopReason.STOP, StopReason.LENGTH, StopReason.STOP, StopReason.FILTERED, StopReason.STOP]
    assert [reason.words for reason in StopReason] == ["finished", "max tokens reached", "context full", "stopped",
                                                       "filtered by the server"]


def test_the_words_travel_as_their_values():
    assert json.dumps({PieceKind.REASONING: StopReason.CONTEXT}) == '{"reasoning": "context"}'
    assert f"{StopReason.LENGTH}" == "length" and PieceKind("answer") is PieceKind.ANSWER
