"""Serving configuration: plain dataclasses, no TensorFlow (the CLI validates flags with them).

- ``BatchingConfig``: the dynamic batcher of each model version;
- ``VersionPolicy``: which versions of a model on disk are served;
- ``Limits``: per-request limits;
- ``ServerOptions``: everything ``create_server`` and ``stitchrec serve`` take;
- ``VersionState``: the states of a model version.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path

# serving.tracing's forms: a span per stage of a call, or one span per call with the stages' times
TRACE_DETAILS = ("stages", "call")
#: the prediction log files' Parquet compressions: snappy (the default: every reader reads it),
#: zstd (smaller, more CPU to write), none (the least CPU, the largest files)
LOG_COMPRESSIONS = ("snappy", "zstd", "none")


class BindError(ValueError):
    """An address the server cannot listen on (taken, or not this machine's): names it."""


class VersionState(enum.StrEnum):
    """The state of a model version: TF Serving's ``ModelVersionStatus.State`` names, which
    GetModelStatus and the ``stitchrec_model_version_state`` metric report.

    START: known, not loading yet; LOADING: loading and warming up; AVAILABLE: served;
    UNLOADING: draining its requests; END: unloaded, or failed to load (with the error).
    """

    START = "START"
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    END = "END"


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching settings of one model version.

    enabled: False runs each request alone (no batching).
    max_batch_size: most examples (rows) in one batch; a single larger request runs alone.
    max_queue_delay_us: longest the oldest queued request waits for others to join it.
    preferred_batch_sizes: batch sizes (rows) dispatched at once when the queue reaches them.
    max_queue_size: most requests waiting; one more fails with RESOURCE_EXHAUSTED.
    max_queued_rows: most examples waiting; a request that would pass it fails with
    RESOURCE_EXHAUSTED (a larger request is taken when the queue is empty).
    concurrency: batches run at the same time on each model instance.
    """

    enabled: bool = True
    max_batch_size: int = 4096
    max_queue_delay_us: int = 500
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 2048
    concurrency: int = 1
    max_queued_rows: int = 65536

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue_size", "concurrency", "max_queued_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"batching: {name} must be an integer >= 1, got {value!r}")
        delay = self.max_queue_delay_us
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(f"batching: max_queue_delay_us must be an integer >= 0, got {delay!r}")
        sizes = tuple(self.preferred_batch_sizes)
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= self.max_batch_size:
                raise ValueError(
                    f"batching: preferred_batch_sizes must be integers in [1, max_batch_size="
                    f"{self.max_batch_size}], got {s!r}"
                )
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(set(sizes))))


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which versions on disk are served: ``latest[:N]``, ``all`` or ``specific:V1,V2``."""

    kind: str = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(
                f"version policy: kind must be latest, all or specific, got {self.kind!r}"
            )
        if self.kind == "latest" and self.count < 1:
            raise ValueError(f"version policy: latest:N needs N >= 1, got {self.count}")
        if self.kind == "specific" and (not self.versions or any(v < 1 for v in self.versions)):
            raise ValueError(
                f"version policy: specific needs versions >= 1, got {list(self.versions)}"
            )

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """``"latest"``, ``"latest:2"``, ``"all"`` or ``"specific:1,3"``."""
        kind, _, arg = text.strip().partition(":")
        try:
            if kind == "latest":
                return cls("latest", int(arg) if arg else 1)
            if kind == "specific":
                return cls("specific", versions=tuple(int(v) for v in arg.split(",") if v))
        except ValueError:
            raise ValueError(
                f"version policy {text!r}: expected latest[:N], all or specific:V1,V2,... "
                f"with integer N and V"
            ) from None
        if kind == "all" and not arg:
            return cls("all")
        raise ValueError(f"version policy {text!r}: expected latest[:N], all or specific:V1,V2,...")

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions to serve out of those ``available`` on disk (ascending)."""
        avail = sorted(set(available))
        if self.kind == "latest":
            return avail[-self.count :]
        if self.kind == "all":
            return avail
        return [v for v in avail if v in self.versions]

    def __str__(self) -> str:
        if self.kind == "latest":
            return "latest" if self.count == 1 else f"latest:{self.count}"
        if self.kind == "all":
            return "all"
        return "specific:" + ",".join(str(v) for v in self.versions)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-request limits, checked before the server allocates for a request.

    max_request_rows: examples in one request (the candidates of a rank request).
    max_tensor_elements: elements one input tensor may declare (TF Serving ``tensor_shape``,
    KServe ``shape``), checked on the declared shape before any value is decoded.
    max_string_bytes: bytes of one string value.
    max_broadcast_bytes: bytes a rank request's user features take once copied over its
    candidates (the sum of the user strings' lengths times the candidates): the model scores
    one row per candidate, so each user value is repeated N times in memory.
    max_message_chars: longest error message sent back (longer ones are cut, saying how much).
    """

    max_request_rows: int = 100_000
    max_tensor_elements: int = 1_000_000
    max_string_bytes: int = 1024 * 1024
    max_broadcast_bytes: int = 32 * 1024 * 1024
    max_message_chars: int = 1000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limits: {f.name} must be an integer >= 1, got {value!r}")
        if self.max_message_chars < 100:
            raise ValueError(
                f"limits: max_message_chars must be >= 100, got {self.max_message_chars}"
            )


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """How a server is run (the ``stitchrec serve`` flags).

    policy / policies: version policy of every model / per model name.
    poll_interval_s: seconds between repository scans (0: load once).
    metrics_port: Prometheus ``/metrics`` HTTP port (None: off; 0: any free port).
    max_message_bytes: largest request or response (bigger: RESOURCE_EXHAUSTED).
    tokens: accepted bearer tokens (empty: no auth). tls_*: PEM files (cert+key: TLS on;
    client_ca: clients must present a certificate it signed).
    reuse_port: bind with SO_REUSEPORT so several processes share the port.
    fusion: honour an export's ``assets.extra/fusion.json`` (``stitchrec export --fuse``):
    planned XLA clusters and batch-size buckets, compiled at load (False: serve it unfused).
    max_inflight: inference calls (Rank, Predict, ModelInfer) handled at once; one more is
    answered RESOURCE_EXHAUSTED at once.
    retry_after_ms: the retry hint of every RESOURCE_EXHAUSTED answer (trailing metadata
    ``retry-after-ms`` and ``grpc-retry-pushback-ms``, which gRPC retry policies honour).
    drain_s: on stop, seconds health reports NOT_SERVING while calls are still served, so load
    balancers move traffic away before new calls are refused (``stitchrec serve``: 5).
    otlp_endpoint: an OpenTelemetry collector's OTLP/gRPC address (``HOST:PORT``, or
    ``http://`` / ``https://HOST:PORT``): spans of every inference call are exported there
    (``serving.tracing``; None: tracing off). trace_sample_rate: the share of traces recorded
    for calls that do not continue a client's trace (0 to 1). trace_detail: ``stages`` (a span
    per stage of a call) or ``call`` (one span per call, the stages' times as its attributes).
    otlp: the exporter's headers, compression and TLS roots (``OtlpSettings``; ``stitchrec
    serve`` reads them from OpenTelemetry's ``OTEL_EXPORTER_OTLP_*`` variables).
    log_dir: the prediction log folder (``serving.prediction_log``; None: no log).
    log_rates: ``((model, rate), ...)``: the share of a model's calls logged, in [0, 1].
    log_default_rate: the share logged of the other models' calls.
    log_flush_s: seconds between the log's flushes (at most this much is lost to a SIGKILL).
    log_compression: the log files' Parquet compression (``snappy``, ``zstd`` or ``none``).
    freeze_heap: after every model-version change, collect garbage and freeze the heap
    (``serving.repository``), so the collector's full passes skip the models' objects.
    http_port / http_host: the HTTP port (TF Serving REST, KServe v2 REST, ``/v1/rank``) served
    by the same process and event loop as gRPC (None: off; 0: any free port), and its address.
    probe_port / probe_host: the health probes answered by a process of their own from the
    event loop's heartbeat (``serving.probes``; None: off; 0: any free port), and its address.
    heartbeat_file: write the heartbeat there (a worker of ``stitchrec serve --workers``, whose
    supervisor runs the probe process); None: only with ``probe_port``, in a folder of its own.
    """

    batching: BatchingConfig = BatchingConfig()
    limits: Limits = Limits()
    policy: str = "latest"
    policies: tuple[tuple[str, str], ...] = ()
    poll_interval_s: float = 0.0
    warmup_sizes: tuple[int, ...] = (1, 100)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    max_message_bytes: int = 64 * 1024 * 1024
    tokens: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    access_log: bool = False
    reuse_port: bool = False
    devices: tuple[str, ...] | None = None
    fusion: bool = True
    max_inflight: int = 256
    retry_after_ms: int = 100
    drain_s: float = 0.0
    otlp_endpoint: str | None = None
    otlp: OtlpSettings = dataclasses.field(default_factory=lambda: OtlpSettings())
    trace_sample_rate: float = 1.0
    trace_detail: str = "stages"
    log_dir: str | None = None
    log_rates: tuple[tuple[str, float], ...] = ()
    log_default_rate: float = 1.0
    log_flush_s: float = 5.0
    log_compression: str = "snappy"
    http_port: int | None = None
    http_host: str = "127.0.0.1"
    probe_port: int | None = None
    probe_host: str = "127.0.0.1"
    heartbeat_file: str | None = None
    freeze_heap: bool = True

    def __post_init__(self) -> None:
        check_otlp_endpoint(self.otlp_endpoint)
        rate = self.trace_sample_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ValueError(f"trace_sample_rate must be a number in [0, 1], got {rate!r}")
        if self.trace_detail not in TRACE_DETAILS:
            raise ValueError(
                f"trace_detail must be one of {TRACE_DETAILS}, got {self.trace_detail!r}"
            )
        self._check_log()
        for name in ("http_port", "probe_port"):
            port = getattr(self, name)
            if port is not None and (
                isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
            ):
                raise ValueError(f"{name} must be an integer in [0, 65535] or None, got {port!r}")
        if isinstance(self.max_inflight, bool) or not isinstance(self.max_inflight, int):
            raise ValueError(f"max_inflight must be an integer >= 1, got {self.max_inflight!r}")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be an integer >= 1, got {self.max_inflight}")
        if not 0 <= self.retry_after_ms <= 3_600_000:
            raise ValueError(f"retry_after_ms must be in [0, 3600000], got {self.retry_after_ms}")
        if not 0 <= self.drain_s <= 3600:
            raise ValueError(f"drain_s must be in [0, 3600] seconds, got {self.drain_s}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key (tls_cert and tls_key)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")

    def check_tls_files(self) -> None:
        """Raises FileNotFoundError naming a TLS file (certificate, key, client CA) that does
        not exist: read when the server binds, checked before it starts anything."""
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"TLS file {path!r} does not exist")

    def _check_log(self) -> None:
        if self.log_dir is not None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise ValueError(f"log_dir must be a folder path or None, got {self.log_dir!r}")
        for name, rate in ((None, self.log_default_rate), *self.log_rates):
            what = "log_default_rate" if name is None else f"log rate of model {name!r}"
            if name is not None and (not isinstance(name, str) or not name):
                raise ValueError(
                    f"log_rates: a model name must be a non-empty string, got {name!r}"
                )
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise ValueError(f"{what} must be a number in [0, 1], got {rate!r}")
        if not 0 < self.log_flush_s <= 3600:
            raise ValueError(f"log_flush_s must be in (0, 3600] seconds, got {self.log_flush_s}")
        if self.log_compression not in LOG_COMPRESSIONS:
            raise ValueError(
                f"log_compression must be snappy, zstd or none, got {self.log_compression!r}"
            )


_ENDPOINT = re.compile(r"^(https?://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})/?$")


def check_otlp_endpoint(endpoint: str | None) -> None:
    """ValueError unless ``endpoint`` is None or ``HOST:PORT`` (``http://`` or ``https://``
    in front allowed; port 1 to 65535)."""
    if endpoint is None:
        return
    m = _ENDPOINT.match(endpoint) if isinstance(endpoint, str) else None
    if m is None or not 1 <= int(m.group(3)) <= 65535:
        raise ValueError(
            f"otlp endpoint {endpoint!r}: expected HOST:PORT (e.g. 127.0.0.1:4317), optionally "
            f"with http:// or https:// in front"
        )


_METADATA_KEY = re.compile(r"^[a-z0-9_.-]+$")
OTLP_VARIABLES = ("HEADERS", "COMPRESSION", "CERTIFICATE", "TIMEOUT")
#: the longest an export may take (its retries included) unless ``..._TIMEOUT`` says otherwise
OTLP_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class OtlpSettings:
    """How spans are sent to the collector, beyond its address.

    headers: ``((name, value), ...)`` sent as gRPC metadata with every export (e.g. a
    collector's API key); names of lower-case letters, digits, ``-``, ``_``, ``.``.
    gzip: compress the export requests. certificate: a PEM file of the root certificates that
    an ``https://`` collector's certificate must chain to (None: the system's roots).
    timeout_s: the longest one export may take, its retries included (> 0).
    """

    headers: tuple[tuple[str, str], ...] = ()
    gzip: bool = False
    certificate: str | None = None
    timeout_s: float = OTLP_TIMEOUT_S

    def __post_init__(self) -> None:
        for name, _ in self.headers:
            if not _METADATA_KEY.match(name) or name.endswith("-bin"):
                raise ValueError(
                    f"otlp header {name!r}: expected a name of lower-case letters, digits, "
                    f"'-', '_' or '.' (not ending in -bin)"
                )
        if self.certificate is not None and not Path(self.certificate).is_file():
            raise ValueError(f"otlp certificate {self.certificate!r}: expected a PEM file")
        if not 0 < self.timeout_s <= 3600:
            raise ValueError(f"otlp timeout {self.timeout_s:g} s: expected (0, 3600] seconds")


def otlp_settings(environ: Mapping[str, str]) -> OtlpSettings:
    """``OtlpSettings`` from OpenTelemetry's exporter variables: ``OTEL_EXPORTER_OTLP_TRACES_X``,
    else ``OTEL_EXPORTER_OTLP_X``, for X in HEADERS (``name=value,...``, values URL-encoded),
    COMPRESSION (``gzip`` or ``none``), CERTIFICATE (a PEM file) and TIMEOUT (milliseconds, as
    the OTLP exporter specification has it). ValueError naming the variable for a value of
    another form (a header's value is never repeated in it)."""
    found: dict[str, tuple[str, str]] = {}
    for part in OTLP_VARIABLES:
        for variable in (f"OTEL_EXPORTER_OTLP_TRACES_{part}", f"OTEL_EXPORTER_OTLP_{part}"):
            if environ.get(variable, "").strip():
                found[part] = (variable, environ[variable].strip())
                break
    headers: list[tuple[str, str]] = []
    if "HEADERS" in found:
        variable, text = found["HEADERS"]
        for i, item in enumerate(text.split(","), 1):
            name, eq, value = item.partition("=")
            if not eq or not name.strip():
                raise ValueError(f"{variable}: entry {i} is not name=value (comma-separated)")
            name = urllib.parse.unquote(name.strip()).lower()
            headers.append((name, urllib.parse.unquote(value.strip())))
    gzip = False
    if "COMPRESSION" in found:
        variable, text = found["COMPRESSION"]
        if text.lower() not in ("gzip", "none"):
            raise ValueError(f"{variable}={text!r}: expected gzip or none")
        gzip = text.lower() == "gzip"
    certificate = found["CERTIFICATE"][1] if "CERTIFICATE" in found else None
    timeout_s = OTLP_TIMEOUT_S
    if "TIMEOUT" in found:
        variable, text = found["TIMEOUT"]
        try:
            timeout_s = float(text) / 1000
        except ValueError:
            timeout_s = float("nan")
        if not 0 < timeout_s <= 3600:
            raise ValueError(f"{variable}={text!r}: expected milliseconds in (0, 3600000]")
    return OtlpSettings(tuple(headers), gzip, certificate, timeout_s)
