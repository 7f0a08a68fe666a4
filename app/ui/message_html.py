"""Chat text as the rich text a Qt label shows: Markdown with fenced code blocks that can be copied,
and one line of per-message figures."""

import re
from html import escape

from markdown_it import MarkdownIt

CODE_BACKGROUND = "#f1f3f5"
# Control characters (a random model writes them) would break Qt's rich text; newlines and tabs stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
DRAFTED_COLOUR = "#7048e8"  # the accepted-drafts colour of the speculation chart
DRAFTED_START, DRAFTED_END = "\ue000", "\ue001"
_BLOCK_PREFIX = re.compile(r"\s*(?:(?:#+|>+|[*+-]|\d+[.)])\s+)*")
_UNMARKED_LINE = re.compile(r"(?:```|~~~).*|[-=*_\s]*")  # fences, rules, setext underlines, blank lines
UNAVAILABLE = "{} unavailable"  # a figure a remote server does not give (None), never shown as zero
STOP_WORDS = {"stop": "finished", "length": "max tokens reached", "context": "context full", "cancelled": "stopped"}


def _code_block(tokens, index, env) -> str:
    token = tokens[index]
    env.setdefault("code_blocks", []).append(token.content)
    language = escape(token.info.split()[0]) if token.info.strip() else "code"
    number = len(env["code_blocks"]) - 1
    return (f'<table width="100%" cellpadding="8" cellspacing="0" bgcolor="{CODE_BACKGROUND}"><tr><td>'
            f'<span style="color:#6b7280">{language}</span> · <a href="copy:{number}">Copy</a>'
            f"<pre>{escape(token.content.rstrip(chr(10)))}</pre></td></tr></table>")


_markdown = MarkdownIt("commonmark", {"html": False})
for _rule in ("fence", "code_block"):
    _markdown.add_render_rule(_rule, lambda self, tokens, index, options, env: _code_block(tokens, index, env))


def clean(text: str) -> str:
    return _CONTROL.sub("", text)


def markdown_html(text: str, drafted_spans: list[list[int]] = ()) -> tuple[str, list[str]]:
    """HTML for `text` and the contents of its code blocks (link `copy:N` copies block N); the
    [start, end) character ranges `drafted_spans` are shown in DRAFTED_COLOUR."""
    env: dict = {}
    html = _markdown.render(clean(_mark(text, drafted_spans)), env)
    html = html.replace(DRAFTED_START, f'<span style="color:{DRAFTED_COLOUR}">').replace(DRAFTED_END, "</span>")
    return html, [block.replace(DRAFTED_START, "").replace(DRAFTED_END, "") for block in env.get("code_blocks", [])]


def _mark(text: str, spans: list[list[int]]) -> str:
    """`text` with private-use characters around each span, which Markdown passes through as text.
    Spans are cut at line ends so that a coloured run never crosses a block, and go after a line's
    block syntax (heading, quote, list item) so that they do not change it; fences and rules stay
    uncoloured."""
    marked, done = [], 0
    for start, end in spans:
        marked.append(text[done:start])
        marked.append("\n".join(_mark_line(line) for line in text[start:end].split("\n")))
        done = end
    marked.append(text[done:])
    return "".join(marked)


def _mark_line(line: str) -> str:
    if _UNMARKED_LINE.fullmatch(line.strip()):
        return line
    prefix = _BLOCK_PREFIX.match(line).group(0)
    return f"{prefix}{DRAFTED_START}{line[len(prefix):]}{DRAFTED_END}"


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
