from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAndWatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "devices", "shared_counters", "partition_type_attribute", "skip_node_operations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SHARED_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_TYPE_ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    SKIP_NODE_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    shared_counters: _containers.RepeatedCompositeFieldContainer[CounterSet]
    partition_type_attribute: str
    skip_node_operations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., shared_counters: _Optional[_Iterable[_Union[CounterSet, _Mapping]]] = ..., partition_type_attribute: _Optional[str] = ..., skip_node_operations: _Optional[_Iterable[str]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("name", "attributes", "capacity", "consumes_counters", "taints", "binds_to_node", "binding_conditions", "binding_failure_conditions", "allow_multiple_allocations", "node_allocatable_resources")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceAttribute
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceAttribute, _Mapping]] = ...) -> None: ...
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceCapacity
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceCapacity, _Mapping]] = ...) -> None: ...
    class NodeAllocatableResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: NodeAllocatableResource
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[NodeAllocatableResource, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CONSUMES_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    BINDS_TO_NODE_FIELD_NUMBER: _ClassVar[int]
    BINDING_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    BINDING_FAILURE_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_MULTIPLE_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_ALLOCATABLE_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    attributes: _containers.MessageMap[str, DeviceAttribute]
    capacity: _containers.MessageMap[str, DeviceCapacity]
    consumes_counters: _containers.RepeatedCompositeFieldContainer[DeviceCounterConsumption]
    taints: _containers.RepeatedCompositeFieldContainer[DeviceTaint]
    binds_to_node: bool
    binding_conditions: _containers.RepeatedScalarFieldContainer[str]
    binding_failure_conditions: _containers.RepeatedScalarFieldContainer[str]
    allow_multiple_allocations: bool
    node_allocatable_resources: _containers.MessageMap[str, NodeAllocatableResource]
    def __init__(self, name: _Optional[str] = ..., attributes: _Optional[_Mapping[str, DeviceAttribute]] = ..., capacity: _Optional[_Mapping[str, DeviceCapacity]] = ..., consumes_counters: _Optional[_Iterable[_Union[DeviceCounterConsumption, _Mapping]]] = ..., taints: _Optional[_Iterable[_Union[DeviceTaint, _Mapping]]] = ..., binds_to_node: _Optional[bool] = ..., binding_conditions: _Optional[_Iterable[str]] = ..., binding_failure_conditions: _Optional[_Iterable[str]] = ..., allow_multiple_allocations: _Optional[bool] = ..., node_allocatable_resources: _Optional[_Mapping[str, NodeAllocatableResource]] = ...) -> None: ...

class DeviceAttribute(_message.Message):
    __slots__ = ("int", "bool", "string", "version")
    INT_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELD_NUMBER: _ClassVar[int]
    STRING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    int: int
    bool: bool
    string: str
    version: str
    def __init__(self, int: _Optional[int] = ..., bool: _Optional[bool] = ..., string: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class DeviceCapacity(_message.Message):
    __slots__ = ("value", "request_policy")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_POLICY_FIELD_NUMBER: _ClassVar[int]
    value: str
    request_policy: CapacityRequestPolicy
    def __init__(self, value: _Optional[str] = ..., request_policy: _Optional[_Union[CapacityRequestPolicy, _Mapping]] = ...) -> None: ...

class CapacityRequestPolicy(_message.Message):
    __slots__ = ("default", "valid_values", "valid_range")
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    VALID_VALUES_FIELD_NUMBER: _ClassVar[int]
    VALID_RANGE_FIELD_NUMBER: _ClassVar[int]
    default: str
    valid_values: _containers.RepeatedScalarFieldContainer[str]
    valid_range: CapacityRequestPolicyRange
    def __init__(self, default: _Optional[str] = ..., valid_values: _Optional[_Iterable[str]] = ..., valid_range: _Optional[_Union[CapacityRequestPolicyRange, _Mapping]] = ...) -> None: ...

class CapacityRequestPolicyRange(_message.Message):
    __slots__ = ("min", "max", "step")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    min: str
    max: str
    step: str
    def __init__(self, min: _Optional[str] = ..., max: _Optional[str] = ..., step: _Optional[str] = ...) -> None: ...

class NodeAllocatableResource(_message.Message):
    __slots__ = ("mapping", "overhead")
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_FIELD_NUMBER: _ClassVar[int]
    mapping: NodeAllocatableMapping
    overhead: NodeAllocatableOverhead
    def __init__(self, mapping: _Optional[_Union[NodeAllocatableMapping, _Mapping]] = ..., overhead: _Optional[_Union[NodeAllocatableOverhead, _Mapping]] = ...) -> None: ...

class NodeAllocatableMapping(_message.Message):
    __slots__ = ("capacity_key", "capacity_multiplier", "device_multiplier")
    CAPACITY_KEY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    capacity_key: str
    capacity_multiplier: str
    device_multiplier: str
    def __init__(self, capacity_key: _Optional[str] = ..., capacity_multiplier: _Optional[str] = ..., device_multiplier: _Optional[str] = ...) -> None: ...

class NodeAllocatableOverhead(_message.Message):
    __slots__ = ("per_pod", "per_container")
    PER_POD_FIELD_NUMBER: _ClassVar[int]
    PER_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    per_pod: str
    per_container: str
    def __init__(self, per_pod: _Optional[str] = ..., per_container: _Optional[str] = ...) -> None: ...

class CounterSet(_message.Message):
    __slots__ = ("name", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Counter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Counter, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    counters: _containers.MessageMap[str, Counter]
    def __init__(self, name: _Optional[str] = ..., counters: _Optional[_Mapping[str, Counter]] = ...) -> None: ...

class DeviceCounterConsumption(_message.Message):
    __slots__ = ("counter_set", "counters", "compatibility_groups")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Counter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Counter, _Mapping]] = ...) -> None: ...
    COUNTER_SET_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    counter_set: str
    counters: _containers.MessageMap[str, Counter]
    compatibility_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, counter_set: _Optional[str] = ..., counters: _Optional[_Mapping[str, Counter]] = ..., compatibility_groups: _Optional[_Iterable[str]] = ...) -> None: ...

class Counter(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: str
    def __init__(self, value: _Optional[str] = ...) -> None: ...

class DeviceTaint(_message.Message):
    __slots__ = ("key", "value", "effect", "time_added")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    TIME_ADDED_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    time_added: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ..., time_added: _Optional[str] = ...) -> None: ...
