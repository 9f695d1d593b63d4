"""The store's validating scanner accepts exactly the JSON that Python's strict parser accepts
(RFC 8259: no NaN/Infinity, UTF-8 only), on random documents and random one-byte corruptions."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent._native import Store

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)
PREFIX = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"1"},"x":'
SUFFIX = b"}}"


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def python_accepts(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return True


def store_accepts(line: bytes) -> bool:
    _rv, _err, events, malformed = Store().feed(line + b"\n")
    assert events + len(malformed) == 1
    return events == 1


@settings(max_examples=500, deadline=None)
@given(
    values,
    st.booleans(),
    st.integers(min_value=0),
    st.integers(0, 255),
    st.sampled_from(["replace", "insert", "delete"]),
)
def test_validity_matches_python(
    value: Any, ascii_only: bool, at: int, byte: int, how: str
) -> None:
    doc = json.dumps(value, ensure_ascii=ascii_only).encode()
    i = at % (len(doc) + 1)
    if byte == 0x0A:
        byte = 0x20  # a newline would end the event line
    if how == "replace" and i < len(doc):
        doc = doc[:i] + bytes([byte]) + doc[i + 1 :]
    elif how == "insert":
        doc = doc[:i] + bytes([byte]) + doc[i:]
    elif how == "delete" and i < len(doc):
        doc = doc[:i] + doc[i + 1 :]
    line = PREFIX + doc + SUFFIX
    assert store_accepts(line) == python_accepts(line), line


@given(values)
def test_valid_documents_are_stored_verbatim(value: Any) -> None:
    line = PREFIX + json.dumps(value, ensure_ascii=False).encode() + SUFFIX
    s = Store()
    assert s.feed(line + b"\n")[2] == 1
    assert s.get("", "a") == line[len(b'{"type":"ADDED","object":') : -1]
