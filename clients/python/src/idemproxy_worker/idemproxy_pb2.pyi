from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Field(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("stream", "entry_id", "key", "fields", "payload", "attempt", "fencing_token", "deadline_unix_ms", "traceparent", "tracestate", "lock")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_id: str
    key: str
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    payload: bytes
    attempt: int
    fencing_token: int
    deadline_unix_ms: int
    traceparent: str
    tracestate: str
    lock: str
    def __init__(self, stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., key: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., payload: _Optional[bytes] = ..., attempt: _Optional[int] = ..., fencing_token: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., lock: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("status", "reason", "stream", "entry_id", "retry_after_ms")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[Ack.Status]
        ACK: _ClassVar[Ack.Status]
        RETRY: _ClassVar[Ack.Status]
        DROP: _ClassVar[Ack.Status]
    STATUS_UNSPECIFIED: Ack.Status
    ACK: Ack.Status
    RETRY: Ack.Status
    DROP: Ack.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    status: Ack.Status
    reason: str
    stream: str
    entry_id: str
    retry_after_ms: int
    def __init__(self, status: _Optional[_Union[Ack.Status, str]] = ..., reason: _Optional[str] = ..., stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...
