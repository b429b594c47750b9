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
        (several processes: the number of live processes where the version is in that state)
    stitchrec_arm_requests_total{model, arm}           requests routed to a traffic arm (a
        label named by the request, or the split's choice; see serving.routing)
    stitchrec_shadow_total{model, outcome}             mirrored calls: scored, dropped (the
        shadow queue was full, or the server stopped), failed (see serving.shadow)
    stitchrec_traffic_config_errors_total{model}       traffic.toml files that failed to parse
        (the last good config kept serving; see serving.traffic)
    stitchrec_log_rows_total{model}                    prediction log rows written
    stitchrec_log_dropped_total{model}                 sampled prediction log rows dropped
        (buffer full, failed write; see serving.prediction_log)
    stitchrec_trace_spans_lost_total{reason}           spans never exported: ``full`` (the span
        buffer was full), ``failed`` (the collector refused them or was away); serving.tracing

Each server owns a registry (several servers can live in one process, as in the tests).

Several processes (``stitchrec serve --workers N``) use prometheus_client's multiprocess mode:
each worker starts with ``PROMETHEUS_MULTIPROC_DIR`` set, so its values live in memory-mapped
files ``<dir>/<kind>_<pid>.db``, and one ``AggregatedMetrics`` in the parent serves a single
``/metrics`` that reads them all (``MultiProcessCollector``): counters and histograms add up
over the processes, the state gauge follows its ``multiprocess_mode`` (``livesum``: a process
that exited stops counting once ``process_exited`` removes its gauge file).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import prometheus_client as prom
from prometheus_client import multiprocess

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

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


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
            multiprocess_mode="livesum",
        )
        self.arm_requests = prom.Counter(
            "stitchrec_arm_requests",
            "Requests routed to a traffic arm",
            ["model", "arm"],
            registry=r,
        )
        self.shadow = prom.Counter(
            "stitchrec_shadow",
            "Mirrored (shadow) calls by outcome: scored, dropped, failed",
            ["model", "outcome"],
            registry=r,
        )
        self.traffic_errors = prom.Counter(
            "stitchrec_traffic_config_errors",
            "traffic.toml files that failed to parse (the last good config kept)",
            ["model"],
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
        self.spans_lost = prom.Counter(
            "stitchrec_trace_spans_lost",
            "Trace spans never exported (full: the span buffer was full; failed: export failed)",
            ["reason"],
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

    def record_arm(self, model: str, arm: str) -> None:
        self.arm_requests.labels(model, arm).inc()

    def record_shadow(self, model: str, outcome: str) -> None:
        self.shadow.labels(model, outcome).inc()

    def record_lost_spans(self, reason: str, spans: int) -> None:
        self.spans_lost.labels(reason).inc(spans)

    def record_traffic_error(self, model: str) -> None:
        self.traffic_errors.labels(model).inc()

    def serve_http(self, port: int, host: str = "127.0.0.1") -> int:
        """Starts the ``/metrics`` HTTP endpoint (a daemon thread); returns its port."""
        self._http = _start_http(port, host, self.registry)
        return int(self._http.server_port)

    def stop_http(self) -> None:
        _stop_http(self._http)
        self._http = None


class AggregatedMetrics:
    """One ``/metrics`` over the metric files that several processes write to one folder.

    ``folder`` None: a fresh temporary folder, removed by ``close``. A folder given (the
    operator's ``PROMETHEUS_MULTIPROC_DIR``) is created if missing and its ``*.db`` files left
    by an earlier run are removed, so the counts start at zero; the folder itself is kept.
    Start the processes with ``env[MULTIPROC_ENV] = self.folder``.
    """

    def __init__(self, folder: str | None = None):
        self.owned = folder is None
        if folder is None:
            folder = tempfile.mkdtemp(prefix="stitchrec-metrics-")
        else:
            if os.path.exists(folder) and not os.path.isdir(folder):
                raise ValueError(f"{MULTIPROC_ENV} {folder!r} is not a folder")
            os.makedirs(folder, exist_ok=True)
            for stale in glob.glob(os.path.join(folder, "*.db")):
                os.remove(stale)
        self.folder = folder
        self.registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(self.registry, path=folder)
        self._http = None

    def serve_http(self, port: int, host: str = "127.0.0.1") -> int:
        """Starts the aggregated ``/metrics`` endpoint (a daemon thread); returns its port."""
        self._http = _start_http(port, host, self.registry)
        return int(self._http.server_port)

    def process_exited(self, pid: int) -> None:
        """Drops the live gauges of process ``pid``; its counters and histograms still count."""
        multiprocess.mark_process_dead(pid, self.folder)

    def close(self) -> None:
        """Stops the endpoint; removes the folder when it is the temporary one."""
        _stop_http(self._http)
        self._http = None
        if self.owned:
            shutil.rmtree(self.folder, ignore_errors=True)


def remove_process_files(folder: str, pid: int) -> bool:
    """Removes the metric files process ``pid`` wrote to ``folder`` (``*_<pid>.db``), then the
    folder when no file is left in it; True when the folder is gone. For a worker whose
    supervisor died without removing its temporary folder: each worker removes its own files
    as it exits, the last one the folder."""
    for path in glob.glob(os.path.join(glob.escape(folder), f"*_{pid}.db")):
        Path(path).unlink(missing_ok=True)
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True  # another worker removed it
    except OSError:
        return False  # files of a worker still running (or not ours) are left
    return True


def _start_http(port: int, host: str, registry: prom.CollectorRegistry) -> WSGIServer:
    server, _thread = prom.start_http_server(port, addr=host, registry=registry)
    return server


def _stop_http(server: WSGIServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
