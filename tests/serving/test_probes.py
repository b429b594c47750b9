"""Health probes from the heartbeat: the probe process's answers follow the heartbeat's age and
ready flag; a server with a probe port is answered while its event loop is held up; a stop is
not ready and ends the process; ``--workers`` probes every worker."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path

import pytest

from serving import probes
from serving.config import ServerOptions
from serving.probes import Heartbeat, ProbeProcess, health, read_beat
from serving.testing import ServerThread, serve_process, wait_until, write_linear_model


def _get(port: int, path: str) -> tuple[int, dict, float]:
    """(status, JSON body, seconds) of ``GET path`` on the probe port."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, json.loads(r.read()), time.perf_counter() - t0
    finally:
        conn.close()


def _write_beat(path: Path, age_s: float, ready: bool) -> None:
    path.write_bytes(probes._BEAT.pack(time.monotonic() - age_s, ready))


def test_health_follows_the_age_and_the_flag_of_every_beat(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    beat = Heartbeat(a)
    assert read_beat(a) == (float("inf"), False)  # created: no beat yet
    beat.beat(True)
    age, ready = read_beat(a)
    assert 0 <= age < 1 and ready
    _write_beat(b, 0.0, True)
    assert health([str(a), str(b)]) == (True, True)
    _write_beat(b, probes.READY_AFTER_S + 1, True)  # held up: still live, not ready
    assert health([str(a), str(b)]) == (True, False)
    _write_beat(b, probes.LIVE_AFTER_S + 1, True)
    assert health([str(a), str(b)]) == (False, False)
    _write_beat(b, 0.0, False)  # beating, but not ready (no model, or stopping)
    assert health([str(a), str(b)]) == (True, False)
    assert health([str(tmp_path / "missing")]) == (False, False)
    beat.close()


def test_the_probe_process_answers_from_the_heartbeat(tmp_path):
    path = tmp_path / "beat"
    _write_beat(path, 0.0, True)
    proc = ProbeProcess("127.0.0.1", 0, [path])
    try:
        assert _get(proc.port, "/v2/health/live")[:2] == (200, {"live": True})
        assert _get(proc.port, "/v2/health/ready")[:2] == (200, {"ready": True})
        _write_beat(path, probes.READY_AFTER_S + 1, True)
        assert _get(proc.port, "/v2/health/live")[:2] == (200, {"live": True})
        assert _get(proc.port, "/v2/health/ready")[:2] == (503, {"ready": False})
        _write_beat(path, probes.LIVE_AFTER_S + 1, True)
        assert _get(proc.port, "/v2/health/live")[:2] == (503, {"live": False})
        status, body, _ = _get(proc.port, "/metrics")
        assert status == 404 and "no probe at /metrics" in body["error"]
        with pytest.raises(OSError, match="did not start"):  # the port is taken
            ProbeProcess("127.0.0.1", proc.port, [path])
    finally:
        proc.stop()
    assert proc.process.returncode == 0


def test_the_probe_process_removes_its_folder_when_its_parent_closes_its_input(tmp_path):
    folder = tmp_path / "beats"
    folder.mkdir()
    _write_beat(folder / "beat", 0.0, True)
    proc = ProbeProcess("127.0.0.1", 0, [folder / "beat"], remove=folder)
    assert _get(proc.port, "/v2/health/ready")[0] == 200
    proc.process.stdin.close()  # what a parent's death does to it
    assert proc.process.wait(30) == 0
    assert not folder.exists()
    proc.stop()


def test_a_server_is_probed_while_its_event_loop_is_held_up(tmp_path):
    write_linear_model(tmp_path / "lin" / "1", bias=0.0)
    srv = ServerThread(tmp_path, ServerOptions(probe_port=0, poll_interval_s=0, drain_s=1.0))
    port = srv.server.probe_port
    process = srv.server.probes._process
    assert port is not None and process is not None
    wait_until(lambda: _get(port, "/v2/health/ready")[0] == 200)
    held = probes.READY_AFTER_S + 1.0

    async def hold() -> None:  # the event loop does nothing else meanwhile
        time.sleep(held)

    t0 = time.monotonic()
    future = srv.submit(hold())
    answers = []  # (seconds into the hold, live status, ready status, slowest answer)
    while time.monotonic() - t0 < held - 0.2:
        live, _, live_s = _get(port, "/v2/health/live")
        ready, _, ready_s = _get(port, "/v2/health/ready")
        answers.append((time.monotonic() - t0, live, ready, max(live_s, ready_s)))
        time.sleep(0.1)
    future.result(10)
    assert all(live == 200 for _, live, _, _ in answers), answers
    assert max(s for _, _, _, s in answers) < 0.5, answers  # never waits for the loop
    late = [ready for t, _, ready, _ in answers if t > probes.READY_AFTER_S + 0.3]
    assert late and set(late) == {503}, answers  # held up past READY_AFTER_S: not ready
    wait_until(lambda: _get(port, "/v2/health/ready")[0] == 200, timeout=5)  # beating again
    stopping = srv.submit(srv.server.stop(5.0))  # drains 1 s: not ready, still live
    wait_until(lambda: _get(port, "/v2/health/ready")[0] == 503, timeout=1.0)
    assert _get(port, "/v2/health/live")[0] == 200
    stopping.result(30)
    srv.loop.call_soon_threadsafe(srv.loop.stop)
    srv.thread.join(10)
    assert process.process.returncode == 0  # ended with the server


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def test_workers_are_probed_together(tmp_path):
    """``--workers 2 --probe-port 0``: ready once both workers beat; a worker killed makes
    the server not ready (its heartbeat ages); SIGTERM ends the probe process too."""
    write_linear_model(tmp_path / "lin" / "1", bias=0.0)
    proc, line = serve_process(
        "--repo", str(tmp_path), "--port", "0", "--workers", "2", "--probe-port", "0",
        "--poll-seconds", "0", "--log-level", "WARNING",
    )  # fmt: skip
    try:
        port = line["probe_port"]
        wait_until(lambda: _get(port, "/v2/health/ready")[0] == 200, timeout=120)
        assert _get(port, "/v2/health/live")[:2] == (200, {"live": True})
        workers = [c for c in _children(proc.pid) if b"--heartbeat-file" in _cmdline(c)]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: _get(port, "/v2/health/ready")[:2] == (503, {"ready": False}), 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGKILL  # the worst exit status: the killed one
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    with pytest.raises(OSError):
        _get(port, "/v2/health/live")


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_supervisor_stops_its_workers_and_leaves_no_temporary_folder(
    tmp_path, monkeypatch
):
    """SIGKILL of ``serve --workers 2 --probe-port 0 --metrics-port 0``: the workers get
    SIGTERM from the kernel (and drain), the probe process ends and removes the heartbeat
    folder, and the workers remove their metric files and the supervisor's metrics folder."""
    write_linear_model(tmp_path / "lin" / "1", bias=0.0)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    proc, line = serve_process(
        "--repo", str(tmp_path), "--port", "0", "--workers", "2", "--probe-port", "0",
        "--poll-seconds", "0", "--drain-seconds", "0", "--log-level", "WARNING",
        "--metrics-port", "0",
    )  # fmt: skip
    try:
        wait_until(lambda: _get(line["probe_port"], "/v2/health/ready")[0] == 200, timeout=120)
        children = _children(proc.pid)
        assert len(children) == 3  # two workers, one probe process
        folders = sorted(f.name.split("-")[1] for f in tmp.iterdir())
        assert folders == ["heartbeats", "metrics"]
        assert list(Path(line["metrics_dir"]).glob("*.db"))  # the workers' metric files
    finally:
        proc.kill()
        proc.wait(30)
    try:
        wait_until(lambda: not any(_running(c) for c in children), timeout=60)
    finally:
        for c in filter(_running, children):  # left running: the test fails, nothing stays
            os.kill(c, signal.SIGKILL)
    assert list(tmp.iterdir()) == []


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_probe_flags_reach_the_options_and_only_the_supervisor_probes(capsys):
    from pipelines import serve
    from pipelines.cli import build_parser

    args = build_parser().parse_args(["serve", "--repo", "m", "--probe-port", "0"])
    one = serve._options(args)
    assert (one.probe_port, one.probe_host, one.heartbeat_file) == (0, args.host, None)
    argv = ["serve", "--repo", "m", "--probe-port", "9100", "--probe-host", "0.0.0.0"]
    args = build_parser().parse_args([*argv, "--workers", "2"])
    assert serve._options(args).probe_port is None  # the supervisor's, not each worker's
    assert "--probe-port" not in serve._worker_argv(args, 8500)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--repo", "m", "--probe-port", "70000"])
    assert "--probe-port" in capsys.readouterr().err
    with pytest.raises(ValueError, match="probe_port must be an integer in"):
        ServerOptions(probe_port=-1)
