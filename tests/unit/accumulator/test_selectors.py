from __future__ import annotations

import pytest

from nodeagent.accumulator.selectors import FieldSelector, LabelSelector


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("a in (x, y)", {"a": "y"}, True),
        ("a in (x,y)", {}, False),
        ("a notin (x,y)", {}, True),
        ("a notin (x,y)", {"a": "x"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("!a", {}, True),
        (
            "app.kubernetes.io/name=x,tier in (fe,be),!canary",
            {"app.kubernetes.io/name": "x", "tier": "be"},
            True,
        ),
        (
            "app.kubernetes.io/name=x,tier in (fe,be),!canary",
            {"app.kubernetes.io/name": "x", "tier": "be", "canary": "1"},
            False,
        ),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["a in x", "=b", "a in ()", "a b"])
def test_label_selector_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="label selector"):
        LabelSelector(bad)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=node-a", True),
        ("spec.nodeName==node-b", False),
        ("spec.nodeName!=node-b,metadata.name=x", True),
        ("metadata.namespace=y", True),
        ("metadata.namespace!=y", False),
        ("spec.missing=", True),
        ("spec.unschedulable=true", True),
    ],
)
def test_field_selector(selector: str, expected: bool) -> None:
    doc = {
        "metadata": {"name": "x", "namespace": "y"},
        "spec": {"nodeName": "node-a", "unschedulable": True},
    }
    assert FieldSelector(selector).matches(doc) is expected


def test_field_selector_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="field selector"):
        FieldSelector("spec.nodeName")
