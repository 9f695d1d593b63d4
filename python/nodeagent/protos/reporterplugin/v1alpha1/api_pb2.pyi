from nodeagent.protos.k8s.apimachinery.pkg.apis.meta.v1 import generated_pb2 as _generated_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FieldType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Spec: _ClassVar[FieldType]
    Status: _ClassVar[FieldType]
    Metadata: _ClassVar[FieldType]
Spec: FieldType
Status: FieldType
Metadata: FieldType

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportContent(_message.Message):
    __slots__ = ("groupVersionKind", "field")
    GROUPVERSIONKIND_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    groupVersionKind: _generated_pb2.GroupVersionKind
    field: _containers.RepeatedCompositeFieldContainer[ReportField]
    def __init__(self, groupVersionKind: _Optional[_Union[_generated_pb2.GroupVersionKind, _Mapping]] = ..., field: _Optional[_Iterable[_Union[ReportField, _Mapping]]] = ...) -> None: ...

class ReportField(_message.Message):
    __slots__ = ("fieldType", "fieldName", "value")
    FIELDTYPE_FIELD_NUMBER: _ClassVar[int]
    FIELDNAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    fieldType: FieldType
    fieldName: str
    value: bytes
    def __init__(self, fieldType: _Optional[_Union[FieldType, str]] = ..., fieldName: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class GetReportContentResponse(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: _containers.RepeatedCompositeFieldContainer[ReportContent]
    def __init__(self, content: _Optional[_Iterable[_Union[ReportContent, _Mapping]]] = ...) -> None: ...
