"""View structs for the Kubernetes objects the agent reads.

Each struct declares only the fields the agent uses, with explicit JSON names (never
``rename="camel"``, which breaks acronyms). Unknown fields are ignored on decode, so a decoded
object is a lossy view: it must never be sent back whole. Writes go through patches, server-side
apply, or objects the caller built and owns entirely.
"""

from __future__ import annotations

import msgspec


class OwnerReference(msgspec.Struct, kw_only=True, omit_defaults=True):
    api_version: str = msgspec.field(name="apiVersion")
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = msgspec.field(default=None, name="blockOwnerDeletion")


class ObjectMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str = ""
    generate_name: str = msgspec.field(default="", name="generateName")
    namespace: str = ""
    uid: str = ""
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    generation: int = 0
    creation_timestamp: str | None = msgspec.field(default=None, name="creationTimestamp")
    deletion_timestamp: str | None = msgspec.field(default=None, name="deletionTimestamp")
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    owner_references: list[OwnerReference] = msgspec.field(
        default_factory=list, name="ownerReferences"
    )
    finalizers: list[str] = msgspec.field(default_factory=list)


class ListMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    continue_: str = msgspec.field(default="", name="continue")
    remaining_item_count: int | None = msgspec.field(default=None, name="remainingItemCount")


class ListHead(msgspec.Struct):
    """Only the list metadata of a List body: what paging and watch resume need."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


class StatusCause(msgspec.Struct, kw_only=True, omit_defaults=True):
    reason: str = ""
    message: str = ""
    field: str = ""


class StatusDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: list[StatusCause] = msgspec.field(default_factory=list)
    retry_after_seconds: int = msgspec.field(default=0, name="retryAfterSeconds")


class Status(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``metav1.Status``: the body of every API error and of watch ERROR events."""

    kind: str = ""
    status: str = ""
    message: str = ""
    reason: str = ""
    code: int = 0
    details: StatusDetails | None = None


class WatchEvent(msgspec.Struct):
    """One watch line with the object left undecoded, to dispatch or store as bytes."""

    type: str
    object: msgspec.Raw


class ObjectHead(msgspec.Struct):
    """Just ``kind`` and ``metadata``: enough to key an object and tell a Status apart."""

    kind: str = ""
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class NodeAddress(msgspec.Struct, kw_only=True):
    type: str
    address: str


class NodeCondition(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: str
    status: str
    reason: str = ""
    message: str = ""


class NodeSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    provider_id: str = msgspec.field(default="", name="providerID")
    unschedulable: bool = False


class NodeStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    capacity: dict[str, str] = msgspec.field(default_factory=dict)
    allocatable: dict[str, str] = msgspec.field(default_factory=dict)
    addresses: list[NodeAddress] = msgspec.field(default_factory=list)
    conditions: list[NodeCondition] = msgspec.field(default_factory=list)


class Node(msgspec.Struct, kw_only=True, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class ConfigMap(msgspec.Struct, kw_only=True, omit_defaults=True):
    api_version: str = msgspec.field(default="v1", name="apiVersion")
    kind: str = "ConfigMap"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] = msgspec.field(default_factory=dict)
    binary_data: dict[str, str] = msgspec.field(default_factory=dict, name="binaryData")
    immutable: bool | None = None
