"""The shipped CustomNodeResource CRD (deploy/crds/) on the real kube-apiserver: it is accepted and
established, takes a CNR shaped as Katalyst writes it, rejects type-invalid ones, and serves the
status subresource."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from nodeagent.kube import CUSTOMRESOURCEDEFINITIONS, KubeClient, errors
from tests.support.crds import CNR, CNR_CRD_FILE, CNR_CRD_NAME, cnr, install_cnr_crd

pytestmark = pytest.mark.releases

UPSTREAM_COMMIT = "1869da5292f8b0d3cb46a35b9035aea0f6cbdb93"

SPEC: dict[str, Any] = {
    "nodeResourceProperties": [
        {"propertyName": "cpu", "propertyQuantity": "8"},
        {"propertyName": "memory", "propertyQuantity": "32Gi"},
        {"propertyName": "numa", "propertyQuantity": 2},
        {"propertyName": "cpu_codename", "propertyValues": ["Icelake"]},
        {"propertyName": "is_vm", "propertyValues": ["false"]},
    ],
    "taints": [
        {
            "key": "node.katalyst.kubewharf.io/pressure",
            "value": "true",
            "effect": "NoSchedule",
            "qosLevel": "reclaimed_cores",
        }
    ],
}

STATUS: dict[str, Any] = {
    "resources": {
        "allocatable": {"resource.katalyst.kubewharf.io/reclaimed_millicpu": "4k"},
        "capacity": {"resource.katalyst.kubewharf.io/reclaimed_millicpu": "8k"},
    },
    "topologyPolicy": "SingleNUMANodeContainerLevel",
    "topologyZone": [
        {
            "type": "Socket",
            "name": "0",
            "children": [
                {
                    "type": "Numa",
                    "name": "0",
                    "resources": {
                        "allocatable": {"cpu": "4", "memory": "16Gi"},
                        "capacity": {"cpu": "4", "memory": "16Gi"},
                    },
                    "attributes": [{"name": "cpu_lists", "value": "0-3"}],
                    "allocations": [{"consumer": "default/pod-1/uid-1", "requests": {"cpu": "1"}}],
                    "siblings": [
                        {
                            "type": "Numa",
                            "name": "1",
                            "attributes": [{"name": "distance", "value": "21"}],
                        }
                    ],
                }
            ],
        }
    ],
}


class _Cond(msgspec.Struct):
    type: str
    status: str


class _CrdStatus(msgspec.Struct):
    conditions: list[_Cond] = []


class _Names(msgspec.Struct, rename="camel"):
    kind: str
    plural: str
    short_names: list[str] = []


class _CrdSpec(msgspec.Struct):
    group: str
    scope: str
    names: _Names


class _Crd(msgspec.Struct):
    spec: _CrdSpec
    status: _CrdStatus


@pytest.fixture
async def cnr_name(admin_client: KubeClient) -> AsyncIterator[str]:
    """A CNR name of this test's own, deleted afterwards (other tests own node-a's and node-b's)."""
    await install_cnr_crd(admin_client)
    name = f"crd-test-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(errors.NotFound):
        await admin_client.delete(CNR, name)


def _causes(exc: errors.ApiError) -> str:
    return " ".join(f"{c.field}: {c.message}" for c in exc.causes) or exc.message


async def test_crd_is_upstreams_and_becomes_established(admin_client: KubeClient) -> None:
    assert f"commit {UPSTREAM_COMMIT}" in CNR_CRD_FILE.read_text()
    await install_cnr_crd(admin_client)
    await install_cnr_crd(admin_client)  # idempotent: the second apply finds it established
    crd = await admin_client.get(CUSTOMRESOURCEDEFINITIONS, CNR_CRD_NAME, into=_Crd)
    assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
    assert (crd.spec.group, crd.spec.scope) == ("node.katalyst.kubewharf.io", "Cluster")
    assert crd.spec.names == _Names("CustomNodeResource", "customnoderesources", ["kcnr"])
    assert await admin_client.discover(CNR.api_version, CNR.kind) == CNR


async def test_a_cnr_as_katalyst_writes_it_is_accepted(
    admin_client: KubeClient, cnr_name: str
) -> None:
    created = msgspec.json.decode(await admin_client.create(CNR, cnr(cnr_name, spec=SPEC)))
    assert created["spec"] == SPEC
    stored = msgspec.json.decode(
        await admin_client.patch(CNR, cnr_name, {"status": STATUS}, subresource="status")
    )
    assert stored["status"] == STATUS  # children kept whole: the schema preserves unknown fields
    assert stored["spec"] == SPEC


async def test_status_subresource_splits_spec_and_status(
    admin_client: KubeClient, cnr_name: str
) -> None:
    created = msgspec.json.decode(
        await admin_client.create(CNR, cnr(cnr_name, spec=SPEC, status=STATUS))
    )
    assert "status" not in created  # a create through the main resource drops status
    # ... and a write through /status drops spec changes, and defaults topologyPolicy.
    other_spec: dict[str, Any] = {"taints": []}
    answer = await admin_client.patch(
        CNR,
        cnr_name,
        {"spec": other_spec, "status": {"resources": STATUS["resources"]}},
        subresource="status",
    )
    stored = msgspec.json.decode(answer)
    assert stored["spec"] == SPEC
    assert stored["status"] == {"resources": STATUS["resources"], "topologyPolicy": "none"}
    got = msgspec.json.decode(await admin_client.get(CNR, cnr_name, subresource="status"))
    assert got["status"] == stored["status"]
    # A main-resource patch leaves status alone.
    patched = msgspec.json.decode(
        await admin_client.patch(
            CNR, cnr_name, {"status": STATUS, "metadata": {"labels": {"a": "b"}}}
        )
    )
    assert patched["status"] == stored["status"]
    assert patched["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize(
    ("spec", "status", "field"),
    [
        ({"nodeResourceProperties": [{"propertyQuantity": "1"}]}, None, "propertyName"),
        (
            {"nodeResourceProperties": [{"propertyName": "cpu", "propertyQuantity": "lots"}]},
            None,
            "propertyQuantity",
        ),
        (
            {"nodeResourceProperties": [{"propertyName": "x", "propertyValues": "a"}]},
            None,
            "propertyValues",
        ),
        (
            {"taints": [{"key": "k", "effect": "NoSchedule", "qosLevel": "reclaimed"}]},
            None,
            "qosLevel",
        ),
        ({"taints": [{"key": "k", "effect": "NoSchedule"}]}, None, "qosLevel"),
        (None, {"topologyZone": [{"name": "0"}]}, "type"),
        (None, {"topologyZone": [{"type": "Numa", "name": 0}]}, "name"),
        (None, {"topologyPolicy": 3}, "topologyPolicy"),
        (None, {"resources": {"allocatable": {"cpu": "many"}}}, "allocatable"),
        (None, {"topologyZone": [{"type": "Numa", "name": "0", "allocations": [{}]}]}, "consumer"),
    ],
)
async def test_a_type_invalid_cnr_is_rejected(
    admin_client: KubeClient,
    cnr_name: str,
    spec: dict[str, Any] | None,
    status: dict[str, Any] | None,
    field: str,
) -> None:
    if spec is not None:
        with pytest.raises(errors.Invalid) as invalid:
            await admin_client.create(CNR, cnr(cnr_name, spec=spec))
    else:
        await admin_client.create(CNR, cnr(cnr_name))
        with pytest.raises(errors.Invalid) as invalid:
            await admin_client.patch(CNR, cnr_name, {"status": status}, subresource="status")
    assert field in _causes(invalid.value)
