"""Targeting: which NodeAgentConfig a node takes (by name, by selector and priority, global),
ties at each level, paused objects, and label-selector semantics."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.source import (
    NodeAgentConfig,
    decode_object,
    select_target,
    selector_matches,
)

NODE = "node-a"
LABELS = {"pool": "web", "zone": "z1", "gpu": ""}


def nac(name: str, **spec: Any) -> NodeAgentConfig:
    return decode_object({"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec})


def sel(**selector: Any) -> dict[str, Any]:
    return selector


def target_name(objects: list[NodeAgentConfig], labels: dict[str, str] = LABELS) -> str | None:
    chosen = select_target(objects, NODE, labels).target
    return chosen.name if chosen else None


def test_an_object_naming_the_node_wins_over_selector_and_global() -> None:
    objects = [
        nac("global"),
        nac("web", nodeSelector=sel(matchLabels={"pool": "web"}), priority=100),
        nac("mine", nodeNames=["node-b", NODE]),
        nac("others", nodeNames=["node-b"]),
    ]
    selection = select_target(objects, NODE, LABELS)
    assert selection.target is not None and selection.target.name == "mine"
    assert "naming this node" in selection.reason and selection.tie == []


def test_the_highest_priority_matching_selector_wins() -> None:
    objects = [
        nac("global"),
        nac("web-low", nodeSelector=sel(matchLabels={"pool": "web"}), priority=1),
        nac("web-high", nodeSelector=sel(matchLabels={"pool": "web"}), priority=5),
        nac("db", nodeSelector=sel(matchLabels={"pool": "db"}), priority=50),
        nac("elsewhere", nodeNames=["node-b"]),
    ]
    selection = select_target(objects, NODE, LABELS)
    assert selection.target is not None and selection.target.name == "web-high"
    assert "priority 5" in selection.reason


def test_a_global_object_when_nothing_more_specific_targets_the_node() -> None:
    objects = [
        nac("global", nodeSelector=sel()),  # an empty selector counts as no selector
        nac("db", nodeSelector=sel(matchLabels={"pool": "db"})),
        nac("elsewhere", nodeNames=["node-b"]),
    ]
    selection = select_target(objects, NODE, LABELS)
    assert selection.target is not None and selection.target.name == "global"
    assert "global" in selection.reason


def test_nothing_targets_the_node() -> None:
    selection = select_target([nac("elsewhere", nodeNames=["node-b"])], NODE, LABELS)
    assert (selection.target, selection.tie) == (None, [])
    assert "no NodeAgentConfig" in selection.reason


@pytest.mark.parametrize(
    ("objects", "tie"),
    [
        ([nac("b", nodeNames=[NODE]), nac("a", nodeNames=[NODE, "x"]), nac("g")], ["a", "b"]),
        (
            [
                nac("w2", nodeSelector=sel(matchLabels={"pool": "web"}), priority=3),
                nac("w1", nodeSelector=sel(matchLabels={"zone": "z1"}), priority=3),
                nac("w0", nodeSelector=sel(matchLabels={"zone": "z1"}), priority=2),
                nac("g"),
            ],
            ["w1", "w2"],
        ),
        (
            [nac("g2"), nac("g1"), nac("db", nodeSelector=sel(matchLabels={"pool": "db"}))],
            ["g1", "g2"],
        ),
    ],
    ids=["by-name", "selector-same-priority", "global"],
)
def test_a_tie_at_the_deciding_level_selects_nothing_and_names_the_objects(
    objects: list[NodeAgentConfig], tie: list[str]
) -> None:
    selection = select_target(objects, NODE, LABELS)
    assert selection.target is None
    assert selection.tie == tie
    assert all(name in selection.reason for name in tie) and "tie" in selection.reason


def test_a_tie_below_the_deciding_level_does_not_matter() -> None:
    objects = [nac("mine", nodeNames=[NODE]), nac("g1"), nac("g2")]
    assert target_name(objects) == "mine"


def test_paused_objects_are_out_of_the_selection() -> None:
    mine = nac("mine", nodeNames=[NODE], paused=True)
    web = nac("web", nodeSelector=sel(matchLabels={"pool": "web"}))
    assert target_name([mine, web, nac("g")]) == "web"
    # A paused object also takes no part in a tie.
    assert target_name([nac("g1"), nac("g2", paused=True)]) == "g1"
    assert target_name([nac("g", paused=True)]) is None


def test_an_object_with_node_names_ignores_its_selector() -> None:
    both = nac("both", nodeNames=["node-b"], nodeSelector=sel(matchLabels={"pool": "web"}))
    assert target_name([both, nac("g")]) == "g"


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({"matchLabels": {"pool": "web", "zone": "z1"}}, True),
        ({"matchLabels": {"pool": "web", "zone": "z2"}}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["db", "web"]}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["db"]}]}, False),
        ({"matchExpressions": [{"key": "absent", "operator": "In", "values": [""]}]}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["db"]}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["web"]}]}, False),
        ({"matchExpressions": [{"key": "absent", "operator": "NotIn", "values": ["x"]}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "absent", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "absent", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"pool": "web"},
                "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}],
            },
            False,
        ),
    ],
)
def test_label_selector_semantics(selector: dict[str, Any], matches: bool) -> None:
    parsed = decode_object({"metadata": {"name": "x"}, "spec": {"nodeSelector": selector}})
    assert parsed.spec.node_selector is not None
    assert selector_matches(parsed.spec.node_selector, LABELS) is matches


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ({"key": "pool", "operator": "Near", "values": ["web"]}, "unknown operator 'Near'"),
        ({"key": "pool", "operator": "In"}, "In needs values"),
        ({"key": "pool", "operator": "Exists", "values": ["web"]}, "Exists takes no values"),
    ],
)
def test_an_invalid_selector_matches_nothing_and_is_reported(
    expression: dict[str, Any], error: str
) -> None:
    bad = nac("bad", nodeSelector=sel(matchExpressions=[expression]), priority=9)
    selection = select_target([bad, nac("g")], NODE, LABELS)
    assert selection.target is not None and selection.target.name == "g"
    assert len(selection.invalid) == 1 and selection.invalid[0][0] == "bad"
    assert error in selection.invalid[0][1]
    assert bad.spec.node_selector is not None
    assert not selector_matches(bad.spec.node_selector, LABELS)


def test_decoding_a_served_object_keeps_what_the_agent_reads() -> None:
    obj = decode_object(
        {
            "apiVersion": "nodeagent.io/v1alpha1",
            "kind": "NodeAgentConfig",
            "metadata": {
                "name": "web",
                "uid": "u1",
                "generation": 3,
                "resourceVersion": "42",
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": {"priority": 2, "config": {"agent": {"log_level": "debug"}}},
            "status": {"anything": True},
        }
    )
    assert (obj.name, obj.metadata.uid, obj.metadata.generation) == ("web", "u1", 3)
    assert obj.metadata.resource_version == "42"
    assert obj.spec.config == {"agent": {"log_level": "debug"}} and obj.spec.priority == 2


def test_decoding_a_malformed_object_names_it_and_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        decode_object({"metadata": {"name": "web"}, "spec": {"priority": "high"}})
    assert "NodeAgentConfig web" in err.value.field and "spec.priority" in err.value.field
    assert "int" in err.value.rule
