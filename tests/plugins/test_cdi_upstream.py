"""The CDI specs the SDK writes (nodeagent.sdk.cdi) read by the upstream CDI library
(tags.cncf.io/container-device-interface at containerd v2.4.2's version, through
tests/harness/cdicheck): every spec build_spec + write_spec produce is valid there, its version is
the library's minimum by its rules for each device, and injecting its devices into a container's OCI
spec gives exactly our edits; what we refuse, the library refuses too (or is documented as
stricter).

The library's MinimumRequiredVersion of a whole spec sees only the last device's mount types and
device node host paths (specs-go v1.1.1 takes the address of a range variable under go 1.19
semantics): it can be lower than ours, which the library accepts (a spec's version must be at
least the minimum). Ours is the version that can express the spec, the one older libraries (which
refuse unknown fields) need; `test_the_library_sees_only_the_last_devices_edits` pins that.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.sdk.cdi import (
    ContainerEdits,
    DeviceNode,
    Mount,
    build_spec,
    check_kind,
    device_id,
    minimum_version,
    spec_file_name,
    write_spec,
)
from tests.support import cdicheck

KIND = "k8s.gpu.example.com/device"
ENV = ContainerEdits({"A": "1"})
# Device nodes the host has: the library stats the host's node for its type and numbers.
HOST_NODES = ("/dev/null", "/dev/zero")

_vendors = st.from_regex(r"[A-Za-z](?:[A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?", fullmatch=True)
_classes = st.from_regex(r"[A-Za-z](?:[A-Za-z0-9_-]{0,6}[A-Za-z0-9])?", fullmatch=True)
kinds = st.builds(lambda v, c: f"{v}/{c}", _vendors, _classes)
# Valid CDI device names, and the SDK's own: "<claim UID>-<device>" starts with a digit or not.
device_names = st.one_of(
    st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]{0,10}[A-Za-z0-9])?", fullmatch=True),
    st.builds(lambda u, i: f"{u}-gpu-{i}", st.uuids(), st.integers(0, 7)),
)
# Any text but '=' and NUL in a name, any text in a value: the file's encoding is checked too.
# Some names shared by devices: a later device's value replaces an earlier one's.
env_names = st.one_of(
    st.sampled_from(["GPU", "PATH"]),
    st.text(st.characters(codec="utf-8", exclude_characters="=\0"), min_size=1, max_size=8),
)
envs = st.dictionaries(env_names, st.text(max_size=12), max_size=4)
device_nodes = st.one_of(
    st.builds(DeviceNode, st.sampled_from(HOST_NODES), st.just(""), st.sampled_from(["", "rw"])),
    st.builds(
        DeviceNode,
        st.builds(lambda i: f"/dev/accel{i}", st.integers(0, 3)),
        st.sampled_from(HOST_NODES),
        st.sampled_from(["", "r", "rw", "rwm", "m", "mw"]),
    ),
)
_segments = st.lists(st.from_regex(r"[a-z0-9_]{1,4}", fullmatch=True), min_size=1, max_size=3)
mounts = st.builds(
    Mount,
    st.one_of(st.just("tmpfs"), st.text(min_size=1, max_size=10).map(lambda t: "/opt/" + t)),
    st.one_of(st.sampled_from(["/data", "/a/b"]), _segments.map(lambda s: "/" + "/".join(s))),
    st.one_of(
        st.just(("ro", "nosuid", "nodev", "bind")),
        st.lists(st.sampled_from(["ro", "rw", "nosuid", "nodev", "bind", "rbind"]), max_size=3),
    ),
    st.sampled_from(["", "bind", "tmpfs"]),
)
edits = st.builds(
    ContainerEdits,
    envs,
    st.lists(device_nodes, max_size=3),
    st.lists(mounts, max_size=3),
).filter(lambda e: bool(e.env or e.device_nodes or e.mounts))
devices = st.dictionaries(device_names, edits, min_size=1, max_size=3)


def _raw_spec(
    kind: str, name: str, edits: ContainerEdits, version: str = "0.5.0"
) -> dict[str, Any]:
    """A spec as build_spec would write it, without its checks."""
    return {
        "cdiVersion": version,
        "kind": kind,
        "devices": [{"name": name, "containerEdits": edits.to_json()}],
    }


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in v.split("."))


def _highest(versions: Sequence[str]) -> str:
    return max(["0.3.0", *versions], key=_version)


def _library_minimum(spec: Mapping[str, Any]) -> str:
    """specs-go v1.1.1's MinimumRequiredVersion of a whole spec: a device name starting with a
    digit counts for every device, mount types and host paths for the last device only."""
    digit = any(d["name"][:1].isdigit() for d in spec["devices"])
    last = minimum_version({**spec, "devices": spec["devices"][-1:]})
    return _highest([last, "0.5.0" if digit else "0.3.0"])


def _expected(
    entries: Sequence[ContainerEdits],
) -> tuple[list[str], list[str], list[dict[str, Any]], list[tuple[str, str]]]:
    """What the library's spec editor makes of the edits applied in order: env by name (a later
    value replaces an earlier one in place), device nodes and mounts by path (a later one
    replaces: removed, appended), mounts then stably sorted by depth; and per node the host node
    and the cgroup access (empty permissions: "rwm")."""
    env: dict[str, str] = {}
    nodes: list[str] = []
    cgroup: list[tuple[str, str]] = []
    mounted: list[dict[str, Any]] = []
    for e in entries:
        env.update(e.env)
        for n in e.device_nodes:
            if n.path in nodes:
                nodes.remove(n.path)
            nodes.append(n.path)
            cgroup.append((n.host_path or n.path, n.permissions or "rwm"))
        for m in e.mounts:
            mounted = [x for x in mounted if x["destination"] != m.container_path]
            mounted.append(
                {
                    "destination": m.container_path,
                    "source": m.host_path,
                    "options": list(m.options),
                    "type": m.type,
                }
            )
    mounted.sort(key=lambda x: os.path.normpath(x["destination"]).count("/"))
    return [f"{k}={v}" for k, v in env.items()], nodes, mounted, cgroup


def _check_injected(oci: Mapping[str, Any], entries: Sequence[ContainerEdits]) -> None:
    env, nodes, mounted, cgroup = _expected(entries)
    assert oci["process"].get("env", []) == env
    linux = oci["linux"]
    assert [d["path"] for d in linux.get("devices", [])] == nodes
    got_mounts = [
        {
            "destination": m["destination"],
            "source": m.get("source", ""),
            "options": m.get("options", []),
            "type": m.get("type", ""),
        }
        for m in oci.get("mounts", [])
    ]
    assert got_mounts == mounted
    # Each node's type and numbers are the host node's, and its cgroup rule has our permissions.
    for d in linux.get("devices", []):
        assert d["type"] == "c"
    rules = linux.get("resources", {}).get("devices", [])
    want = []
    for host, access in cgroup:
        rdev = os.stat(host).st_rdev
        want.append(
            {
                "allow": True,
                "type": "c",
                "major": os.major(rdev),
                "minor": os.minor(rdev),
                "access": access,
            }
        )
    assert rules == want


@settings(max_examples=40)
@given(kind=kinds, claim_uid=st.uuids().map(str), spec_devices=devices)
def test_the_library_reads_every_spec_we_write(
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    claim_uid: str,
    spec_devices: dict[str, ContainerEdits],
) -> None:
    directory = tmp_path_factory.mktemp("cdi")
    spec = build_spec(kind, spec_devices)
    path = write_spec(str(directory), spec_file_name(kind, claim_uid), spec)

    result = cdicheck.validate(path)
    assert result["error"] == ""
    assert result["version"] == spec["cdiVersion"]
    assert minimum_version(spec) == spec["cdiVersion"]
    assert _highest(result["deviceMinimumVersions"]) == spec["cdiVersion"]
    assert result["minimumVersion"] == _library_minimum(spec)

    ids = [device_id(kind, name) for name in spec_devices]
    _check_injected(cdicheck.inject(directory, ids), list(spec_devices.values()))


@pytest.mark.parametrize(
    ("first", "version"),
    [
        (ContainerEdits(mounts=[Mount("/opt/a", "/a", type="bind")]), "0.4.0"),
        (ContainerEdits(device_nodes=[DeviceNode("/dev/accel0", "/dev/null")]), "0.5.0"),
    ],
)
def test_the_library_sees_only_the_last_devices_edits(
    tmp_path: pathlib.Path, first: ContainerEdits, version: str
) -> None:
    spec = build_spec(KIND, {"gpu0": first, "gpu1": ContainerEdits({"A": "1"})})
    assert spec["cdiVersion"] == version
    path = write_spec(str(tmp_path), "x.json", spec)
    result = cdicheck.validate(path)
    assert result == {
        "minimumVersion": "0.3.0",  # the library's whole-spec answer: only gpu1 seen
        "deviceMinimumVersions": [version, "0.3.0"],
        "version": version,
        "error": "",
    }
    # Reversed, the library sees the device that needs it.
    spec = build_spec(KIND, {"gpu1": ContainerEdits({"A": "1"}), "gpu0": first})
    path = write_spec(str(tmp_path), "x.json", spec)
    assert cdicheck.validate(path)["minimumVersion"] == version == spec["cdiVersion"]


def test_the_spec_file_name_is_found_and_the_temporary_file_is_not(tmp_path: pathlib.Path) -> None:
    kind = "k8s.gpu.example.com/device"
    claims = [str(uuid.UUID(int=1)), str(uuid.UUID(int=2))]
    for claim in claims:
        name = f"{claim}-gpu-0"
        write_spec(
            str(tmp_path),
            spec_file_name(kind, claim),
            build_spec(kind, {name: ContainerEdits({"CLAIM": claim}, [DeviceNode("/dev/null")])}),
        )
    assert sorted(os.listdir(tmp_path)) == [
        "k8s.gpu.example.com-device_00000000-0000-0000-0000-000000000001.json",
        "k8s.gpu.example.com-device_00000000-0000-0000-0000-000000000002.json",
    ]
    oci = cdicheck.inject(tmp_path, [device_id(kind, f"{claims[1]}-gpu-0")])
    assert oci["process"]["env"] == [f"CLAIM={claims[1]}"]
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/null"]

    # write_spec's temporary file (a crash between write and rename leaves it) is not read: its
    # device does not resolve, and the library reports no error for the file.
    spec = build_spec(kind, {"stale": ContainerEdits({"STALE": "1"})})
    name = spec_file_name(kind, str(uuid.UUID(int=3)))
    (tmp_path / f".{name}.tmp-12345").write_text(json.dumps(spec))
    with pytest.raises(cdicheck.CdiInjectError) as caught:
        cdicheck.inject(tmp_path, [device_id(kind, "stale")])
    assert caught.value.result["unresolved"] == [device_id(kind, "stale")]
    assert caught.value.result["specErrors"] == {}


@pytest.mark.parametrize(
    "kind",
    [
        "gpu",
        "/gpu",
        "example.com/",
        "example.com",
        "1example.com/gpu",
        "example.com-/gpu",
        "example.com/gpu-",
        "example.com/-gpu",
        "exa mple.com/gpu",
        "example.com/gpu\n",
        "example.com\n/gpu",
        "example.com/gpu/0",
        "exämple.com/gpu",
    ],
)
def test_a_kind_the_library_refuses_is_refused(tmp_path: pathlib.Path, kind: str) -> None:
    with pytest.raises(ValueError, match="cdi_kind"):
        check_kind(kind)
    with pytest.raises(ValueError):
        build_spec(kind, {"gpu0": ContainerEdits({"A": "1"})})
    path = write_spec(str(tmp_path), "x.json", _raw_spec(kind, "gpu0", ContainerEdits({"A": "1"})))
    assert cdicheck.validate(path)["error"] != ""


def test_a_class_with_a_dot_is_refused_though_the_library_takes_it_at_0_6_0(
    tmp_path: pathlib.Path,
) -> None:
    """Stricter than the library on purpose: such a spec would need cdiVersion 0.6.0, which
    older runtimes cannot read."""
    kind = "example.com/gpu.a100"
    with pytest.raises(ValueError, match="cdi_kind"):
        check_kind(kind)
    edits = ContainerEdits({"A": "1"})
    path = write_spec(str(tmp_path), "x.json", _raw_spec(kind, "gpu0", edits, "0.6.0"))
    assert cdicheck.validate(path) == {
        "minimumVersion": "0.6.0",
        "deviceMinimumVersions": ["0.6.0"],
        "version": "0.6.0",
        "error": "",
    }


@pytest.mark.parametrize(
    ("name", "edits", "reason"),
    [
        ("-gpu0", ENV, "CDI device name"),
        ("gpu0-", ENV, "CDI device name"),
        (".gpu0", ENV, "CDI device name"),
        ("gpu0\n", ENV, "CDI device name"),
        ("gpu/0", ENV, "CDI device name"),
        ("gpu 0", ENV, "CDI device name"),
        ("gpu=0", ENV, "CDI device name"),
        ("gpü0", ENV, "CDI device name"),
        ("", ENV, "CDI device name"),
        ("gpu0", ContainerEdits(), "no edits"),
        ("gpu0", ContainerEdits(mounts=[Mount("", "/data")]), "empty host path"),
        ("gpu0", ContainerEdits(device_nodes=[DeviceNode("/dev/null", "", "rwx")]), "rwm"),
    ],
)
def test_a_device_the_library_refuses_is_refused(
    tmp_path: pathlib.Path, name: str, edits: ContainerEdits, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        build_spec(KIND, {name: edits})
    path = write_spec(str(tmp_path), "x.json", _raw_spec(KIND, name, edits))
    assert cdicheck.validate(path)["error"] != ""


def test_a_spec_without_devices_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="no devices"):
        build_spec(KIND, {})
    path = write_spec(str(tmp_path), "x.json", {"cdiVersion": "0.3.0", "kind": KIND, "devices": []})
    assert "no devices" in cdicheck.validate(path)["error"]


@pytest.mark.parametrize(
    "value",
    [
        "\U0001f600",  # above U+FFFF: JSON's escape is a surrogate pair, which YAML refuses
        "\x85",  # NEL: raw, YAML folds it as a line break
        "\x7f\x9f",  # DEL and a C1 control: raw, YAML refuses them
        "\ufeff\ufffe\uffff",
        "\u2028\u2029",
        "\0\t\n\r\"\\'",
        "é ü \xa0 \u4e2d",
        "a=b: [c] {d} # e & *f",
    ],
)
def test_any_text_in_a_value_reaches_the_container_unchanged(
    tmp_path: pathlib.Path, value: str
) -> None:
    entries = {"gpu0": ContainerEdits({"V": value}, mounts=[Mount("/opt/" + value, "/v")])}
    path = write_spec(str(tmp_path), "x.json", build_spec(KIND, entries))
    assert cdicheck.validate(path)["error"] == ""
    oci = cdicheck.inject(tmp_path, [device_id(KIND, "gpu0")])
    assert oci["process"]["env"] == [f"V={value}"]
    assert oci["mounts"][0]["source"] == "/opt/" + value


def test_a_lone_surrogate_is_refused_before_the_file_is_written(tmp_path: pathlib.Path) -> None:
    spec = build_spec(KIND, {"gpu0": ContainerEdits({"V": "\udc80"})})
    with pytest.raises(ValueError):
        write_spec(str(tmp_path), "x.json", spec)
    assert os.listdir(tmp_path) == []
