"""Prometheus metrics of one server process, served over HTTP (``/metrics``).

    stitchrec_requests_total{method, code}             RPCs answered, by gRPC status code
    stitchrec_request_failures_total{method, code}     the subset that did not end OK
    stitchrec_rejected_total{method, reason}           calls refused by admission control:
        inflight, queue_requests, queue_rows, deadline, stopping (see serving.admission)
    stitchrec_request_latency_seconds{method}          histogram of time in the handler
    stitchrec_queue_seconds{model}                     histogram of time in the batch queue
    stitchrec_batch_rows{model}                        histogram of examples per batch
    stitchrec_batch_requests{model}                    histogram of requests per batch
    stitchrec_model_version_state{model, version, state}  1 for the version's current state
    stitchrec_log_rows_total{model}                    prediction log rows written
    stitchrec_log_dropped_total{model}                 sampled prediction log rows dropped
        (buffer full, failed write; see serving.prediction_log)

Each server owns a registry (several servers can live in one process, as in the tests). With
``--workers N`` every worker process serves its own metrics on ``metrics_port + index``.
"""

from __future__ import annotations

import prometheus_client as prom

from serving.config import VersionState

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
_SIZE_BUCKETS = tuple(float(2**i) for i in range(15))


class Metrics:
    """The server's counters and histograms, in their own registry."""

    def __init__(self, registry: prom.CollectorRegistry | None = None):
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "stitchrec_requests", "RPCs answered", ["method", "code"], registry=r
        )
        self.failures = prom.Counter(
            "stitchrec_request_failures", "RPCs that did not end OK", ["method", "code"], registry=r
        )
        self.rejected = prom.Counter(
            "stitchrec_rejected",
            "Calls refused by admission control",
            ["method", "reason"],
            registry=r,
        )
        self.latency = prom.Histogram(
            "stitchrec_request_latency_seconds",
            "Time in the RPC handler",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = prom.Histogram(
            "stitchrec_queue_seconds",
            "Time a request waited in the batch queue",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = prom.Histogram(
            "stitchrec_batch_rows",
            "Examples per batch",
            ["model"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_requests = prom.Histogram(
            "stitchrec_batch_requests",
            "Requests per batch",
            ["model"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.version_state = prom.Gauge(
            "stitchrec_model_version_state",
            "1 for the current state of each model version",
            ["model", "version", "state"],
            registry=r,
        )
        self.log_rows = prom.Counter(
            "stitchrec_log_rows", "Prediction log rows written", ["model"], registry=r
        )
        self.log_dropped = prom.Counter(
            "stitchrec_log_dropped",
            "Sampled prediction log rows dropped (buffer full or failed write)",
            ["model"],
            registry=r,
        )
        self._http = None

    def record_rpc(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method, code).inc()
        if code != "OK":
            self.failures.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)

    def record_rejection(self, method: str, reason: str) -> None:
        self.rejected.labels(method, reason).inc()

    def record_batch(self, model: str, rows: int, requests: int, waits: list[float]) -> None:
        self.batch_rows.labels(model).observe(rows)
        self.batch_requests.labels(model).observe(requests)
        q = self.queue.labels(model)
        for w in waits:
            q.observe(w)

    def record_state(self, model: str, version: int, state: str) -> None:
        for s in VersionState:
            self.version_state.labels(model, str(version), s.value).set(1.0 if s == state else 0.0)

    def serve_http(self, port: int, host: str = "127.0.0.1") -> int:
        """Starts the ``/metrics`` HTTP endpoint (a daemon thread); returns its port."""
        server, _thread = prom.start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
