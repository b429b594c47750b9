"""A local OTLP/gRPC trace receiver that counts what it is sent, for bench.serving.front_door.

``OtlpSink()`` serves ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` on a free
port of 127.0.0.1 (``endpoint``: ``"127.0.0.1:<port>"``, the value of ``stitchrec serve
--otlp-endpoint``); every Export adds its spans (over all resource and scope spans) to
``spans`` and one to ``exports``, and answers an empty ``ExportTraceServiceResponse``.
``stop()`` ends the server.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Counts exported spans: ``spans`` (total), ``exports`` (calls)."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{port}"
        self._server.start()

    def Export(self, request, context):
        n = sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
        with self._lock:
            self.spans += n
            self.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"spans": self.spans, "exports": self.exports}

    def stop(self) -> None:
        self._server.stop(grace=1).wait()
