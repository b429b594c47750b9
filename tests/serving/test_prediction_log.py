"""The prediction log: logged rows replay to the served scores, deterministic per-call sampling,
a full buffer drops and counts, a SIGKILLed server leaves only readable files, flag errors."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from pipelines import serve
from pipelines.cli import build_parser, main
from serving.calls import ScoredCall
from serving.config import ServerOptions
from serving.log_format import features_of, log_files, read_logs
from serving.metrics import Metrics
from serving.prediction_log import PredictionLogger, sample_fraction
from serving.testing import ServerThread, features, wait_serving, write_linear_model

ROOT = Path(__file__).resolve().parents[2]


def _call(request_id: str, rows: int = 2, model: str = "lin") -> ScoredCall:
    return ScoredCall(
        request_id=request_id,
        timestamp=1.0,
        protocol="grpc",
        model=model,
        version=1,
        signature="serving_default",
        arm="",
        shadow=False,
        features=features(["u1"] * rows, list(range(rows)), [0.5] * rows),
        outputs={"score": np.full((rows,), 0.25, np.float32)},
    )


def _predict(stub, feats: dict[str, np.ndarray], request_id: str) -> np.ndarray:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    for k, v in feats.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    res = stub.Predict(req, timeout=20, metadata=[("x-request-id", request_id)])
    return tf.make_ndarray(res.outputs["score"])


def test_logged_rows_replay_to_the_served_scores(tmp_path):
    model = write_linear_model(tmp_path / "repo" / "lin" / "1", bias=-0.25)
    logs = tmp_path / "logs"
    options = ServerOptions(log_dir=str(logs), log_flush_s=30.0, log_compression="zstd")
    served = {}
    with ServerThread(tmp_path / "repo", options) as s:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(s.target))
        rng = np.random.default_rng(0)
        for i in range(5):
            n = i + 1
            feats = features(
                [f"u{j % 3}" for j in range(n)],
                rng.integers(0, 6, n).tolist(),
                rng.normal(size=n).tolist(),
            )
            served[f"req-{i}"] = _predict(stub, feats, f"req-{i}")
    # the stop flushed the buffer: a 30 s flush period has not passed
    table = read_logs([logs])
    assert table.num_rows == sum(v.size for v in served.values()) == 15
    assert set(table.column("model").to_pylist()) == {"lin"}
    group = pq.ParquetFile(log_files([logs])[0]).metadata.row_group(0)
    assert group.column(0).compression == "ZSTD"  # the server's log_compression
    ids = table.column("request_id").to_pylist()
    rows = table.column("row").to_numpy()
    logged = table.column("output.score").to_numpy()
    got = np.array([served[r][k] for r, k in zip(ids, rows, strict=True)], np.float32)
    np.testing.assert_array_equal(logged, got)
    # replayed through the SavedModel call by call (the shapes the server ran): the same float32
    fn = tf.saved_model.load(str(model)).signatures["serving_default"]
    for rid, score in served.items():
        part = table.filter(pc.equal(table.column("request_id"), rid))
        feats = {k: v.to_numpy(zero_copy_only=False) for k, v in features_of(part).items()}
        replay = fn(
            **{
                k: tf.constant(v.astype(object) if v.dtype == object else v)
                for k, v in feats.items()
            }
        )["score"].numpy()
        np.testing.assert_array_equal(replay, score)
    registry = s.server.metrics.registry
    assert registry.get_sample_value("stitchrec_log_rows_total", {"model": "lin"}) == 15


def test_sampling_keeps_whole_calls_by_request_id(tmp_path):
    ids = [f"call-{i}" for i in range(600)]
    logger = PredictionLogger(tmp_path, {"lin": 0.3}, default_rate=1.0, flush_s=60)
    for r in ids:
        logger(_call(r, rows=3))
        logger(_call(r, rows=1, model="other"))  # default rate: every call
    logger.close()
    lin = read_logs([tmp_path], model="lin")
    kept = set(lin.column("request_id").to_pylist())
    assert 0.25 < len(kept) / len(ids) < 0.35
    assert lin.num_rows == 3 * len(kept)  # whole calls: every row of a kept call
    assert kept == {r for r in ids if sample_fraction(r) < 0.3}  # a pure function of the id
    assert read_logs([tmp_path], model="other").num_rows == len(ids)
    assert logger.rows_dropped == {}


def test_full_buffer_drops_calls_and_counts_them(tmp_path):
    metrics = Metrics()
    logger = PredictionLogger(
        tmp_path, default_rate=1.0, flush_rows=100, flush_s=600, max_buffer_rows=5, metrics=metrics
    )
    for i in range(4):
        logger(_call(f"r{i}", rows=2))  # 2 + 2 fit; the third and fourth would pass 5 rows
    assert logger.buffered_rows() == 4
    logger.close()
    assert logger.rows_written == {"lin": 4} and logger.rows_dropped == {"lin": 4}
    assert metrics.registry.get_sample_value("stitchrec_log_dropped_total", {"model": "lin"}) == 4
    assert read_logs([tmp_path]).column("request_id").to_pylist() == ["r0", "r0", "r1", "r1"]
    logger(_call("late"))  # after close: dropped, never written
    assert logger.rows_dropped == {"lin": 6}


def test_a_call_that_cannot_be_logged_is_dropped_and_the_rest_written(tmp_path):
    metrics = Metrics()
    logger = PredictionLogger(tmp_path, default_rate=1.0, flush_s=600, metrics=metrics)
    bad = dataclasses.replace(_call("bad", rows=3), outputs={"score": np.zeros(2, np.float32)})
    for call in (_call("r0"), bad, _call("r1", rows=1)):
        logger(call)
    logger.close()
    assert read_logs([tmp_path]).column("request_id").to_pylist() == ["r0", "r0", "r1"]
    assert logger.rows_written == {"lin": 3} and logger.rows_dropped == {"lin": 2}
    assert metrics.registry.get_sample_value("stitchrec_log_dropped_total", {"model": "lin"}) == 2


def test_flush_rows_starts_a_flush_without_waiting(tmp_path):
    logger = PredictionLogger(tmp_path, flush_rows=4, flush_s=600)
    for i in range(2):
        logger(_call(f"r{i}", rows=2))
    t0 = time.monotonic()
    while not log_files([tmp_path]) and time.monotonic() - t0 < 10:
        time.sleep(0.02)
    assert read_logs([tmp_path]).num_rows == 4
    logger.close()


_FIRST_FLUSH = """
import sys
import numpy as np
from serving.calls import ScoredCall
from serving.prediction_log import PredictionLogger
logger = PredictionLogger(sys.argv[1], flush_s=600)
before = set(sys.modules)
logger(ScoredCall("r1", 0.0, "grpc", "lin", 1, "serving_default", "", False,
                  {"user": np.array([b"u1", b"u2"], object), "price": np.zeros(2, np.float32)},
                  {"score": np.zeros((2, 1), np.float32)}))
assert logger.flush(), "nothing written"
print(sorted(set(sys.modules) - before))
"""


def test_the_first_flush_imports_nothing(tmp_path):
    """A writer started by ``PredictionLogger`` has loaded what Arrow loads on its first
    conversion and write (pandas among it), so the first flush under traffic does not spend
    the interpreter lock importing it (a fresh process: nothing imported by other tests)."""
    p = subprocess.run(
        [sys.executable, "-c", _FIRST_FLUSH, str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"
    assert read_logs([tmp_path]).num_rows == 2


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"default_rate": 1.5}, "default_rate must be a number in [0, 1], got 1.5"),
        ({"rates": {"lin": -0.1}}, "rate of model 'lin' must be a number in [0, 1]"),
        ({"flush_s": 0}, "flush_s must be a number > 0, got 0"),
        ({"max_buffer_rows": 0}, "max_buffer_rows must be an integer >= 1, got 0"),
        ({"compression": "lz4"}, "prediction log: compression must be one of"),
    ],
)
def test_logger_rejects_bad_settings(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PredictionLogger(tmp_path, **kwargs)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--log-rate", "1.5"], "error: --log-rate '1.5': expected R or MODEL=R with R a number"),
        (["--log-rate", "lin=x"], "error: --log-rate 'lin=x': expected R or MODEL=R"),
        (["--log-rate", "=0.5"], "error: --log-rate '=0.5'"),
        (["--log-flush-seconds", "0"], "error: log_flush_s must be in (0, 3600] seconds, got 0"),
    ],
)
def test_serve_rejects_bad_log_flags(tmp_path, capsys, flags, message):
    assert main(["serve", "--repo", str(tmp_path), "--log-dir", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def _load(
    target: str, stop: threading.Event, sent: list[str], answered: list[tuple[str, float]]
) -> None:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    i = 0
    while not stop.is_set():
        rid = f"load-{threading.get_ident()}-{i}"
        sent.append(rid)
        try:
            _predict(stub, features(["u1", "u2"], [3, 4], [0.5, 1.5]), rid)
        except grpc.RpcError:
            return  # the server is gone
        answered.append((rid, time.monotonic()))
        i += 1


def test_sigkill_under_load_leaves_only_readable_files(tmp_path):
    write_linear_model(tmp_path / "repo" / "lin" / "1", bias=0.0)
    logs = tmp_path / "logs"
    flush_s = 0.3
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(tmp_path / "repo"),
        "--host", "127.0.0.1", "--port", "0", "--poll-seconds", "0", "--log-level", "WARNING",
        "--log-dir", str(logs), "--log-flush-seconds", str(flush_s),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    answered: list[tuple[str, float]] = []
    sent: list[str] = []
    try:
        line = json.loads(proc.stdout.readline())
        port = line["port"]
        assert port > 0 and line["serving"] == f"127.0.0.1:{port}"  # the bound address
        target = f"127.0.0.1:{port}"
        wait_serving(target)
        threads = [
            threading.Thread(target=_load, args=(target, stop, sent, answered)) for _ in range(3)
        ]
        for t in threads:
            t.start()
        time.sleep(2.0)
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(30)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    files = sorted(logs.rglob("*.parquet"))
    assert files, "no log file was written before the kill"
    for f in files:
        pq.read_table(f)  # every complete file reads; a temporary one is hidden (.part-*.tmp)
    logged = set(read_logs([logs]).column("request_id").to_pylist())
    assert logged <= set(sent)
    # what was answered before the last flush period (with a margin) is in the log
    old = {r for r, t in answered if t < killed - flush_s - 1.0}
    assert old and old <= logged


def test_log_flags_reach_the_options_and_the_workers():
    argv = ["serve", "--repo", "models", "--log-dir", "logs", "--log-rate", "0.25"]
    argv += ["--log-rate", "ctr=1", "--log-flush-seconds", "2", "--workers", "2"]
    args = build_parser().parse_args([*argv, "--log-compression", "zstd"])
    opts = serve._options(args)
    assert (opts.log_dir, opts.log_default_rate, opts.log_flush_s) == ("logs", 0.25, 2.0)
    assert opts.log_compression == "zstd"
    assert opts.log_rates == (("ctr", 1.0),)
    worker = serve._worker_argv(args, 8500)
    assert worker[worker.index("--log-dir") + 1] == "logs"
    assert [worker[i + 1] for i, a in enumerate(worker) if a == "--log-rate"] == ["0.25", "ctr=1"]
    assert worker[worker.index("--log-flush-seconds") + 1] == "2.0"
    assert worker[worker.index("--log-compression") + 1] == "zstd"
    defaults = serve._options(build_parser().parse_args(["serve", "--repo", "models"]))
    assert (defaults.log_dir, defaults.log_default_rate, defaults.log_rates) == (None, 1.0, ())
    assert defaults.log_compression == "snappy"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"log_rates": (("lin", 2.0),)}, "log rate of model 'lin' must be a number in [0, 1]"),
        ({"log_rates": (("", 0.5),)}, "log_rates: a model name must be a non-empty string"),
        ({"log_default_rate": -1}, "log_default_rate must be a number in [0, 1], got -1"),
        ({"log_dir": ""}, "log_dir must be a folder path or None, got ''"),
        ({"log_compression": "lz4"}, "log_compression must be snappy, zstd or none, got 'lz4'"),
    ],
)
def test_server_options_check_the_log_settings(kwargs, message):
    with pytest.raises(ValueError) as err:
        ServerOptions(**kwargs)
    assert message in str(err.value)
