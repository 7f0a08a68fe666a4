"""Chat text as the rich text a Qt label shows: Markdown with fenced code blocks that can be copied."""

import re
from html import escape

from markdown_it import MarkdownIt

from app.ui.theme import current

# Control characters (a random model writes them) would break Qt's rich text; newlines and tabs stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
DRAFTED_START, DRAFTED_END = "\ue000", "\ue001"
_BLOCK_PREFIX = re.compile(r"\s*(?:(?:#+|>+|[*+-]|\d+[.)])\s+)*")
_UNMARKED_LINE = re.compile(r"(?:```|~~~).*|[-=*_\s]*")  # fences, rules, setext underlines, blank lines


def _code_block(tokens, index, env) -> str:
    token = tokens[index]
    env.setdefault("code_blocks", []).append(token.content)
    language = escape(token.info.split()[0]) if token.info.strip() else "code"
    number = len(env["code_blocks"]) - 1
    palette = current()
    return (f'<table width="100%" cellpadding="8" cellspacing="0" bgcolor="{palette.code_background}"><tr><td>'
            f'<span style="color:{palette.muted}">{language}</span> · <a href="copy:{number}">Copy</a>'
            f"<pre>{escape(token.content.rstrip(chr(10)))}</pre></td></tr></table>")


_markdown = MarkdownIt("commonmark", {"html": False})
for _rule in ("fence", "code_block"):
    _markdown.add_render_rule(_rule, lambda self, tokens, index, options, env: _code_block(tokens, index, env))


def clean(text: str) -> str:
    return _CONTROL.sub("", text)


def markdown_html(text: str, drafted_spans: list[list[int]] = ()) -> tuple[str, list[str]]:
    """HTML for `text` and the contents of its code blocks (link `copy:N` copies block N); the
    [start, end) character ranges `drafted_spans` are shown in the theme's drafted colour."""
    env: dict = {}
    html = _markdown.render(clean(_mark(text, drafted_spans)), env)
    html = html.replace(DRAFTED_START, f'<span style="color:{current().drafted}">').replace(DRAFTED_END, "</span>")
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
