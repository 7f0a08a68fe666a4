"""The demo's training text is the same in every run of the same Python: a signature whose default is a
sentinel object names the object without its memory address."""

from tools.demo.corpus import _callable_items

_SENTINEL = object()


def documented(value=_SENTINEL, *, other=None):
    """Do something with `value`."""


def test_a_sentinel_default_appears_without_its_address():
    doc = next(item for item in _callable_items("m.documented", documented) if item.kind == "doc")
    assert doc.answer.startswith("`m.documented(value=<object object>, *, other=None)`")
    assert "0x" not in doc.answer
