"""An answer's figures as one line of words: speed, time to first token, tokens, accepted drafts, why
it stopped (the chat shows it under each answer; the Markdown export writes it)."""

UNAVAILABLE = "{} unavailable"  # a figure a remote server does not give (None), never shown as zero
STOP_WORDS = {"stop": "finished", "length": "max tokens reached", "context": "context full", "cancelled": "stopped"}


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
        parts.append(STOP_WORDS.get(stats["stop_reason"], stats["stop_reason"]))
    return " · ".join(parts)
