"""Chat text as the rich text a Qt label shows: Markdown with fenced code blocks that can be copied,
and one line of per-message figures."""

import re
from html import escape

from markdown_it import MarkdownIt

CODE_BACKGROUND = "#f1f3f5"
# Control characters (a random model writes them) would break Qt's rich text; newlines and tabs stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
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


def markdown_html(text: str) -> tuple[str, list[str]]:
    """HTML for `text` and the contents of its code blocks (link `copy:N` copies block N)."""
    env: dict = {}
    html = _markdown.render(clean(text), env)
    return html, env.get("code_blocks", [])


def stats_line(stats: dict) -> str:
    parts = []
    if "tok_s" in stats:
        parts.append(f"{stats['tok_s']:.1f} tok/s")
    if "ttft_s" in stats:
        parts.append(f"first token {stats['ttft_s']:.2f} s")
    if "tokens" in stats:
        parts.append(f"{stats['tokens']} tokens")
    if "mean_accepted" in stats:
        parts.append(f"{stats['mean_accepted']:.2f} accepted per step")
    if "stop_reason" in stats:
        parts.append(STOP_WORDS.get(stats["stop_reason"], stats["stop_reason"]))
    return " · ".join(parts)
