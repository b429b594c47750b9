"""OTLP/gRPC export of recorded spans, encoded straight to protobuf's wire format.

``encode_request(spans, resource)`` returns the bytes of one
``opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`` (one resource, one
instrumentation scope, the spans in order); ``OtlpSender`` posts them to a collector's
``TraceService/Export``.

Why not the protobuf classes: encoding a span of fourteen attributes through the SDK's encoder
(one generated ``KeyValue`` and ``AnyValue`` object per attribute) costs about 68 us of
interpreter time, in the server's process and under its interpreter lock; writing the same
fields as bytes costs about 13 us (``python -m bench.serving.tracing_cost``, 2-core VM). The
messages written are OTLP's ``trace.proto`` / ``common.proto`` / ``resource.proto`` (field
numbers in the ``_F_*`` constants); ``tests/serving/test_otlp_wire.py`` parses the output with
the generated classes and compares it with the OpenTelemetry SDK's own encoding of the same
spans.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource

from serving.config import OtlpSettings
from serving.trace_spans import SCOPE, RecordedSpan

logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RETRIED = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)
ENCODE_CHUNK_SPANS = 64  # spans encoded between two releases of the interpreter lock
FIRST_RETRY_S = 0.1  # backoff before the first retry, doubled for each next one
WARN_EVERY_S = 30.0  # at most one warning about failed exports per this many seconds

# wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_SMALL = [bytes((i,)) for i in range(128)]  # the one-byte varints
_PACK_D = struct.Struct("<d").pack
_PACK_Q = struct.Struct("<Q").pack
_PACK_I = struct.Struct("<I").pack


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]
    if value < 0:
        value &= 0xFFFFFFFFFFFFFFFF  # int64 as two's complement, ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _len(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _len(field, text.encode("utf-8"))


# AnyValue: string 1, bool 2, int 3, double 4, array 5, kvlist 6, bytes 7
_ANY_STR, _ANY_BOOL, _ANY_INT, _ANY_DOUBLE = (
    _tag(1, _LEN),
    _tag(2, _VARINT),
    _tag(3, _VARINT),
    _tag(4, _I64),
)


def _any_value(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        raw = value.encode("utf-8")
        return _ANY_STR + _varint(len(raw)) + raw
    if kind is int:
        return _ANY_INT + _varint(value)
    if kind is float:
        return _ANY_DOUBLE + _PACK_D(value)
    if kind is bool:
        return _ANY_BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, bytes):
        return _len(7, value)
    if isinstance(value, Sequence) and not isinstance(value, str):  # ArrayValue: values 1
        return _len(5, b"".join(_len(1, _any_value(v)) for v in value))
    raise TypeError(
        f"span attribute values are str, bool, int, float, bytes or lists; got {value!r}"
    )


_KEYS: dict[str, bytes] = {}  # KeyValue.key (field 1) and value's tag (field 2), per name seen
_MAX_KEYS = 1024
_KV_VALUE = _tag(2, _LEN)


def _attributes(field: int, attributes: Mapping[str, Any]) -> bytes:
    """Repeated ``KeyValue`` (key 1, value 2) as field ``field`` of the enclosing message."""
    tag = _tag(field, _LEN)
    out = []
    for key, value in attributes.items():
        head = _KEYS.get(key)
        if head is None:
            head = _str(1, key) + _KV_VALUE
            if len(_KEYS) < _MAX_KEYS:
                _KEYS[key] = head
        any_value = _any_value(value)
        pair = head + _varint(len(any_value)) + any_value
        out.append(tag + _varint(len(pair)) + pair)
    return b"".join(out)


# Span fields
_F_TRACE_ID, _F_SPAN_ID, _F_TRACE_STATE, _F_PARENT, _F_NAME, _F_KIND = 1, 2, 3, 4, 5, 6
_F_START, _F_END, _F_ATTRIBUTES, _F_EVENTS, _F_STATUS, _F_FLAGS = 7, 8, 9, 11, 15, 16
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags
_T_TRACE_ID, _T_SPAN_ID, _T_PARENT = (
    _tag(_F_TRACE_ID, _LEN),
    _tag(_F_SPAN_ID, _LEN),
    _tag(_F_PARENT, _LEN),
)
_T_KIND, _T_START, _T_END = _tag(_F_KIND, _VARINT), _tag(_F_START, _I64), _tag(_F_END, _I64)
_T_FLAGS = _tag(_F_FLAGS, _I32)
_LOCAL_FLAGS = _T_FLAGS + _PACK_I(_HAS_IS_REMOTE)
_REMOTE_FLAGS = _T_FLAGS + _PACK_I(_HAS_IS_REMOTE | _IS_REMOTE)
_STATUS_UNSET = _len(_F_STATUS, b"")


def _fixed64(field: int, value: int) -> bytes:
    return _tag(field, _I64) + _PACK_Q(value)


def _span(span: RecordedSpan) -> bytes:
    context, parent = span.context, span.parent
    parts = [
        _T_TRACE_ID + b"\x10" + context.trace_id.to_bytes(16, "big"),
        _T_SPAN_ID + b"\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        state = ",".join(f"{k}={v}" for k, v in context.trace_state.items())
        parts.append(_str(_F_TRACE_STATE, state))
    if parent is not None:
        parts.append(_T_PARENT + b"\x08" + parent.span_id.to_bytes(8, "big"))
    parts += [
        _str(_F_NAME, span.name),
        _T_KIND + _SMALL[span.kind.value + 1],  # OTLP's kinds count from UNSPECIFIED
        _T_START + _PACK_Q(span.start_time),
        _T_END + _PACK_Q(span.end_time or span.start_time),
        _attributes(_F_ATTRIBUTES, span.attributes),
    ]
    for name, timestamp, attrs in span.events:  # Event: time 1, name 2, attributes 3
        parts.append(
            _len(_F_EVENTS, _fixed64(1, timestamp) + _str(2, name) + _attributes(3, attrs))
        )
    status = span.status  # Status: message 2, code 3
    if status.status_code.value or status.description:
        body = _str(2, status.description) if status.description else b""
        if status.status_code.value:
            body += _tag(3, _VARINT) + _varint(status.status_code.value)
        parts.append(_len(_F_STATUS, body))
    else:
        parts.append(_STATUS_UNSET)
    parts.append(_REMOTE_FLAGS if parent is not None and parent.is_remote else _LOCAL_FLAGS)
    return b"".join(parts)


def encode_resource(resource: Resource) -> bytes:
    """``ResourceSpans.resource`` (field 1): the resource's attributes."""
    return _len(1, _attributes(1, resource.attributes))


_SCOPE = _len(1, _str(1, SCOPE))  # ScopeSpans.scope: InstrumentationScope(name)


def encode_request(
    spans: Sequence[RecordedSpan], resource: bytes, chunk: int | None = ENCODE_CHUNK_SPANS
) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``spans`` under ``resource`` (``encode_resource``).

    The spans are encoded ``chunk`` at a time with a ``time.sleep(0)`` after each chunk: encoding
    holds the interpreter lock, and the pause lets the server's event loop take it between
    chunks (None: all in one go)."""
    step = chunk or max(len(spans), 1)
    parts = []
    for i in range(0, len(spans), step):
        parts.append(b"".join(_len(2, _span(s)) for s in spans[i : i + step]))
        if chunk and i + step < len(spans):
            time.sleep(0)
    return _len(1, resource + _len(2, _SCOPE + b"".join(parts)))


class OtlpSender:
    """Exports batches of recorded spans to an OTLP/gRPC collector (a ``SpanBuffer`` sink).

    ``endpoint``: ``HOST:PORT`` or ``http://HOST:PORT`` (plaintext), ``https://HOST:PORT``
    (TLS, with ``settings.certificate``'s roots or the system's). ``settings``: headers sent with
    every export, gzip compression, the export timeout. A batch the collector refuses with a
    transient code (``RETRIED``) is sent again after 0.1 s, 0.2 s, ... while ``settings.timeout_s``
    lasts; then it is dropped (a warning at most every ``WARN_EVERY_S``).
    """

    def __init__(
        self,
        endpoint: str,
        resource: Resource,
        settings: OtlpSettings | None = None,
    ) -> None:
        settings = settings or OtlpSettings()
        target = endpoint.split("://", 1)[-1]
        compression = grpc.Compression.Gzip if settings.gzip else None
        if endpoint.startswith("https://"):
            roots = None
            if settings.certificate is not None:
                with open(settings.certificate, "rb") as f:
                    roots = f.read()
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
            self._channel = grpc.secure_channel(target, credentials, compression=compression)
        else:
            self._channel = grpc.insecure_channel(target, compression=compression)
        self._metadata = settings.headers or None
        self._call = self._channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=None,  # the request is already bytes
            response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
        )
        self._endpoint = endpoint
        self._timeout_s = settings.timeout_s
        self._resource = encode_resource(resource)
        self._warned = -WARN_EVERY_S

    def __call__(self, spans: Sequence[RecordedSpan]) -> bool:
        body = encode_request(spans, self._resource)
        deadline = time.monotonic() + self._timeout_s
        wait = FIRST_RETRY_S
        while True:
            left = deadline - time.monotonic()
            try:
                self._call(body, timeout=max(left, 0.01), metadata=self._metadata)
                return True
            except grpc.RpcError as e:
                code = e.code()
                if code not in RETRIED or left < wait:
                    self._warn(len(spans), code)
                    return False
            time.sleep(wait)
            wait *= 2

    def _warn(self, spans: int, code: grpc.StatusCode) -> None:
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            logger.warning(
                "could not export %d spans to the OTLP collector at %s: %s",
                spans,
                self._endpoint,
                code.name,
            )

    def close(self) -> None:
        self._channel.close()
