"""The demo model's training text: the Python standard library's own documentation, shaped as chats.

Every public module, class, function and method of the standard library that this Python has gives
questions such as "What does `json.dumps` do?" answered by its signature and docstring, "How is
`textwrap.dedent` implemented?" answered by its source, and the language topics of `pydoc` (the
reference manual's sections that `help("assert")` shows). All of it ships with Python under the PSF
licence, so the data is on every machine and the trained model may be redistributed.

An item is held out (never trained on; used for perplexity and acceptance) when the CRC32 of its name
falls in the last HELD_OUT_PERCENT of 100, so the split does not depend on the order or the seed.
"""

import contextlib
import importlib
import inspect
import io
import pkgutil
import random
import re
import sys
import textwrap
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

HELD_OUT_PERCENT = 4
MAX_ANSWER_CHARS = 1400
SMOKE_MODULES = ("json", "textwrap", "string", "shlex", "fnmatch", "bisect", "heapq")
# Modules whose import has effects (a browser, a window, printed text) or that are only tests.
SKIPPED_MODULES = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__main__", "pydoc_data", "lib2to3",
    "ensurepip", "venv", "test", "distutils", "msvcrt", "winreg", "winsound", "msilib", "nt",
}

QUESTIONS = {
    "doc": ("What does `{name}` do?", "Explain `{name}`.", "How do I use `{name}` in Python?"),
    "source": ("Show me the source code of `{name}`.", "How is `{name}` implemented?"),
    "module": ("What is the `{name}` module for?", "Tell me about the `{name}` module."),
    "topic": ("Explain the Python topic '{name}'.", "What does the Python reference say about '{name}'?"),
}
REASONING_EFFORTS = (None, None, "low", "medium", "high")
# A default such as `<object object at 0x7f…>` differs from run to run; the data must not.
OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class Item:
    kind: str  # a key of QUESTIONS
    name: str
    answer: str

    @property
    def held_out(self) -> bool:
        return zlib.crc32(f"{self.kind}:{self.name}".encode()) % 100 >= 100 - HELD_OUT_PERCENT


@dataclass(frozen=True)
class Chat:
    messages: list[dict]  # the prompt: system (optional) and user
    reasoning_effort: str | None
    answer: str


def collect_items(smoke: bool = False) -> list[Item]:
    """Every documented item of the standard library (a few modules with `smoke`), in a fixed order."""
    names = SMOKE_MODULES if smoke else sorted(
        name for name in sys.stdlib_module_names if not name.startswith("_") and name not in SKIPPED_MODULES
    )
    items = [item for module in _import_all(names, walk=not smoke) for item in _module_items(module)]
    if not smoke:
        items += _topic_items()
    return items


def as_chats(items: list[Item], seed: int, questions_per_item: int = 1) -> list[Chat]:
    """Each item asked `questions_per_item` ways (templates and reasoning efforts drawn from `seed`)."""
    rng = random.Random(seed)
    chats = []
    for item in items:
        for template in rng.sample(QUESTIONS[item.kind], min(questions_per_item, len(QUESTIONS[item.kind]))):
            messages = [{"role": "user", "content": template.format(name=item.name)}]
            chats.append(Chat(messages, rng.choice(REASONING_EFFORTS), item.answer))
    rng.shuffle(chats)
    return chats


def invented_items(items: list[Item], count: int, seed: int) -> list[Item]:
    """`count` names that do not exist, each one training item's module path with another's last part
    ("json.dedent"), of the kinds "doc" and "source", without answers: prompts whose answer the target has
    not learned, as held-out prompts are, so that a drafter also sees how the target continues there. No
    name of `items` comes out, held-out ones included: those prompts measure the drafter."""
    rng = random.Random(seed)
    callables = [item for item in items if not item.held_out and item.kind in ("doc", "source") and "." in item.name]
    known = {item.name for item in items}
    invented: dict[str, Item] = {}
    for _ in range(count * 20):
        if len(invented) == count or not callables:
            break
        head, tail = rng.choice(callables), rng.choice(callables)
        name = head.name.rsplit(".", 1)[0] + "." + tail.name.rsplit(".", 1)[1]
        if name not in known and name not in invented:
            invented[name] = Item(head.kind, name, "")
    return list(invented.values())


def _import_all(names, walk: bool) -> Iterator:
    for name in names:
        module = _quiet_import(name)
        if module is None:
            continue
        yield module
        if walk and hasattr(module, "__path__"):
            for info in pkgutil.walk_packages(module.__path__, name + "."):
                parts = info.name.split(".")[1:]
                if any(part.startswith("_") or part in ("test", "tests", "idle_test") for part in parts):
                    continue
                submodule = _quiet_import(info.name)
                if submodule is not None:
                    yield submodule


def _quiet_import(name: str):
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # a platform's missing module fails in many ways, SystemExit included
        return None


def _module_items(module) -> Iterator[Item]:
    name = module.__name__
    doc = inspect.getdoc(module)
    if doc:
        yield Item("module", name, _shorten(doc))
    for attribute, value in list(vars(module).items()):
        if attribute.startswith("_") or getattr(value, "__module__", None) != name:
            continue
        if inspect.isclass(value):
            yield from _callable_items(f"{name}.{attribute}", value)
            for method_name, method in list(vars(value).items()):
                if not method_name.startswith("_") and callable(method):
                    yield from _callable_items(f"{name}.{attribute}.{method_name}", method)
        elif inspect.isfunction(value) or inspect.isbuiltin(value):
            yield from _callable_items(f"{name}.{attribute}", value)


def _callable_items(name: str, value) -> Iterator[Item]:
    doc = inspect.getdoc(value)
    if doc:
        try:
            signature = str(inspect.signature(value)) if not inspect.isclass(value) else ""
        except (TypeError, ValueError):
            signature = ""
        signature = OBJECT_ADDRESS.sub(">", signature)
        yield Item("doc", name, _shorten(f"`{name}{signature}`\n\n{doc}"))
    if inspect.isfunction(value):
        try:
            source = inspect.getsource(value)
        except (OSError, TypeError):
            return
        yield Item("source", name, "```python\n" + _shorten(textwrap.dedent(source).strip()) + "\n```")


def _topic_items() -> Iterator[Item]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield Item("topic", name, _shorten(topics[name].strip()))


def _shorten(text: str) -> str:
    """At most MAX_ANSWER_CHARS, cut at a line end."""
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    cut = text.rfind("\n", 0, MAX_ANSWER_CHARS)
    return text[: cut if cut > MAX_ANSWER_CHARS // 2 else MAX_ANSWER_CHARS].rstrip()
