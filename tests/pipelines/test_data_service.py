"""``[data] data_service`` and ``stitchrec data-service``: a training run whose TFRecord input
is made by a tf.data service dispatcher and worker (real processes on 127.0.0.1, started with
the command) ends bitwise where the run reading its own input ends, across a resume; bad
settings are one error line; the servers stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from features.tfrecord import service
from features.tfrecord.service import check_reachable
from pipelines.cli import main
from pipelines.config import ConfigError, load_config
from pipelines.distribute import free_ports
from pipelines.run.model import load_trained_model
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_run_config

MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
TRAIN = {"batch_size": 256, "epochs": 2, "learning_rate": 0.01, "checkpoint_every": 5}


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """``stitchrec data-service ARGS`` in the background and the address it prints."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "data-service", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"data-service {args[0]} ended before serving (status {proc.wait()})")
    return proc, json.loads(line)["address"]


@pytest.fixture(scope="module")
def dispatcher():
    """(the address of a dispatcher, the pid of its one worker), each its own process; both
    must end with status 0 on SIGTERM."""
    disp, address = _start("dispatcher", "--port", "0")
    worker, _ = _start("worker", "--dispatcher", address, "--host", "127.0.0.1")
    yield address, worker.pid
    for proc in (worker, disp):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def _write(
    tmp_path, data, name: str, data_extra: str, fmt: str = "tfrecord", extra: str = "", **train
):
    return write_run_config(
        tmp_path / f"{name}.toml",
        data,
        tmp_path / name,
        MODEL,
        {**TRAIN, **train},
        data_extra=f'{NO_VALIDATION}\ninput_format = "{fmt}"\n{data_extra}',
    )


def _cfg(tmp_path, data, name: str, data_extra: str, **train):
    return load_config(_write(tmp_path, data, name, data_extra, **train))


def _read_bytes(pid: int) -> int:
    """Bytes process ``pid`` has read from files, pipes and ttys so far (gRPC's sockets are
    not counted: ``test_distribute_ps._usage``)."""
    return psutil.Process(pid).io_counters().read_chars


def _weights(run) -> list[np.ndarray]:
    return [w.numpy() for w in load_trained_model(run)[0].weights]


def test_a_served_run_resumed_is_bitwise_the_local_run(tmp_path, shared_tiny_data, dispatcher):
    quiet = lambda _: None  # noqa: E731
    address, worker = dispatcher
    served = f'data_service = "{address}"'
    read0 = _read_bytes(worker)
    stopped = train(_cfg(tmp_path, shared_tiny_data, "served", served, max_steps=11), quiet)
    assert stopped["steps"] == 11
    # where the input is made may change on resume (here the timeout)
    again = f"{served}\ndata_service_timeout = 60.0"
    resumed = train(_cfg(tmp_path, shared_tiny_data, "served", again), quiet)
    assert resumed["steps"] == 32 and resumed["steps_this_run"] == 21
    other_rows = f"{again}\nsplit_seed = 7"  # the rows' split is the run's: it may not change
    with pytest.raises(ConfigError, match=r"holds a run whose \[data\] differ"):
        train(_cfg(tmp_path, shared_tiny_data, "served", other_rows), quiet)
    read1 = _read_bytes(worker)
    local = train(_cfg(tmp_path, shared_tiny_data, "local", ""), quiet)
    # the worker read the served run's TFRecord files (2 epochs: at least once), not the local's
    size = sum(
        f.stat().st_size for f in (tmp_path / "served/data/tfrecord/train").glob("*.tfrecord")
    )
    assert read1 - read0 >= size > 0
    assert _read_bytes(worker) - read1 < size / 10
    assert local["test"] == resumed["test"]
    for a, b in zip(_weights(tmp_path / "served"), _weights(tmp_path / "local"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_service_without_workers_stops_the_run_and_a_worker_resumes_it(
    tmp_path, shared_tiny_data
):
    disp, address = _start("dispatcher", "--port", "0")
    try:
        served = f'data_service = "{address}"\ndata_service_timeout = 2.0'
        config = _write(tmp_path, shared_tiny_data, "stalled", served)
        cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]
        stalled = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert stalled.returncode == 3, stalled.stderr[-2000:]
        err = [ln for ln in stalled.stderr.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and f"no batch from the tf.data service at {address} for 2 s" in err[0]
        worker, _ = _start("worker", "--dispatcher", address)
        try:
            done = train(load_config(config), lambda _: None)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0
        assert done["steps"] == 32
    finally:
        disp.send_signal(signal.SIGTERM)
        assert disp.wait(timeout=60) == 0


def test_a_dispatcher_that_does_not_answer_is_one_error_line(
    tmp_path, shared_tiny_data, dispatcher, capsys, monkeypatch
):
    check_reachable(dispatcher[0], timeout=30)  # the running one answers
    monkeypatch.setattr(service, "REACH_SECONDS", 1.0)
    nobody = f'data_service = "127.0.0.1:{free_ports(1)[0]}"'
    config = _write(tmp_path, shared_tiny_data, "nobody", nobody)
    t0 = time.monotonic()
    assert main(["train", "--config", str(config)]) == 2
    assert time.monotonic() - t0 < 60  # tf.data service alone would wait forever
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tf.data service dispatcher answers at grpc://127.0.0.1:" in err[0]


def test_a_worker_without_its_dispatcher_is_one_error_line(capsys, monkeypatch):
    monkeypatch.setattr(service, "REACH_SECONDS", 1.0)
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    t0 = time.monotonic()
    assert main(["data-service", "worker", "--dispatcher", nobody, "--port", "0"]) == 2
    assert time.monotonic() - t0 < 30  # tf.data service's worker alone waits forever
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --dispatcher: no tf.data service dispatcher")


def test_data_service_settings_are_checked(tmp_path, shared_tiny_data, capsys, monkeypatch):
    with pytest.raises(ConfigError, match=r"data_service_timeout must be > 0 seconds, got 0"):
        _cfg(tmp_path, shared_tiny_data, "t", 'data_service = "h:1"\ndata_service_timeout = 0')
    with pytest.raises(ConfigError, match=r"data_service: .* expected HOST:PORT"):
        _cfg(tmp_path, shared_tiny_data, "a", 'data_service = "localhost"')
    parquet = _write(tmp_path, shared_tiny_data, "b", 'data_service = "h:1"', fmt="parquet")
    with pytest.raises(ConfigError, match=r"data_service needs input_format = 'tfrecord'"):
        load_config(parquet)
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    config = _write(tmp_path, shared_tiny_data, "c", 'data_service = "h:1"')
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a run with [data] data_service trains in one process only" in err[0]


@pytest.mark.parametrize("shared", [False, True])
def test_a_port_in_use_is_one_error_line(capsys, shared):
    """Also a port whose listener allows sharing it (SO_REUSEPORT, as a running dispatcher's
    gRPC server does): a second dispatcher would take half of its connections."""
    with socket.socket() as taken:
        if shared:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["data-service", "dispatcher", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--port {port}: the tf.data service dispatcher cannot" in err[0]
    assert "Address already in use" in err[0]
