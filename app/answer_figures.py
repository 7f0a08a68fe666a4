"""An answer's figures as one line of words: speed, time to first token, tokens, accepted drafts, why
it stopped (the chat shows it under each answer; the Markdown export writes it)."""

from app.protocol.kinds import StopReason

UNAVAILABLE = "{} unavailable"  # a figure a remote server does not give (None), never shown as zero


def stats_line(stats: dict) -> str:
    parts = []
    if "tok_s" in stats:
        parts.append(UNAVAILABLE.format("tok/s") if stats["tok_s"] is None else f"{stats['tok_s']:.1f} tok/s")
    if "ttft_s" in stats:
        parts.append(UNAVAILABLE.format("first token") if stats["ttft_s"] is None
                     else f"first token {stats['ttft_s']:.2f} s")
    if "tokens" in stats:
        parts.append(UNAVAILABLE.format("tokens") if stats["tokens"] is None else f"{stats['tokens']} tokens")
    if "mean_accepted" in stats:
        parts.append(f"{stats['mean_accepted']:.2f} accepted per step")
    if "stop_reason" in stats:
        parts.append(_stop_words(stats["stop_reason"]))
    return " · ".join(parts)


def _stop_words(stop_reason: str) -> str:
    """A stop reason in words; what an interrupted answer stored instead (why) as it is."""
    try:
        return StopReason(stop_reason).words
    except ValueError:
        return stop_reason
