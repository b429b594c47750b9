"""``serving.metrics.AggregatedMetrics``: the metrics of several real processes (each a small
Python process recording into ``serving.metrics.Metrics`` under ``PROMETHEUS_MULTIPROC_DIR``)
served as one ``/metrics``: counters and histograms summed, the state gauge a live sum."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pipelines.serve import METRICS_TEMPORARY_ENV, workers_env
from serving.metrics import MULTIPROC_ENV, AggregatedMetrics, remove_process_files

ROOT = Path(__file__).resolve().parents[2]
RECORD = """
import os, sys
from serving.metrics import Metrics
m = Metrics()
for _ in range(int(sys.argv[1])):
    m.record_rpc("Rank", "OK", 0.003)
m.record_rpc("Predict", "INVALID_ARGUMENT", 0.001)
m.record_state("ctr", 1, "AVAILABLE")
print(os.getpid())
"""


def _record(folder: Path, calls: int) -> int:
    """Runs one process recording ``calls`` OK Rank calls; returns its pid."""
    env = {**os.environ, MULTIPROC_ENV: str(folder), "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", RECORD, str(calls)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return int(p.stdout)


def _value(text: str, sample: str) -> list[float]:
    return [float(v) for v in re.findall("^" + re.escape(sample) + r" (\S+)$", text, re.M)]


def test_processes_add_up_in_one_scrape(tmp_path):
    folder = tmp_path / "prom"
    folder.mkdir()
    (folder / "counter_1.db").write_bytes(b"left by an earlier run")
    metrics = AggregatedMetrics(str(folder))
    assert not (folder / "counter_1.db").exists()  # the counts start at zero
    pids = [_record(folder, 3), _record(folder, 5)]
    port = metrics.serve_http(0)
    try:

        def scrape() -> str:
            url = f"http://127.0.0.1:{port}/metrics"
            return urllib.request.urlopen(url, timeout=10).read().decode()

        text = scrape()
        assert _value(text, 'stitchrec_requests_total{code="OK",method="Rank"}') == [8.0]
        failed = 'stitchrec_request_failures_total{code="INVALID_ARGUMENT",method="Predict"}'
        assert _value(text, failed) == [2.0]
        assert _value(text, 'stitchrec_request_latency_seconds_count{method="Rank"}') == [8.0]
        # 0.003 s falls in the 0.005 bucket: 8 there, none at 0.002
        assert _value(text, 'stitchrec_request_latency_seconds_bucket{le="0.005",method="Rank"}') == [8.0]  # fmt: skip
        assert _value(text, 'stitchrec_request_latency_seconds_bucket{le="0.002",method="Rank"}') == [0.0]  # fmt: skip
        state = 'stitchrec_model_version_state{model="ctr",state="AVAILABLE",version="1"}'
        assert _value(text, state) == [2.0]
        assert _value(text, state.replace("AVAILABLE", "LOADING")) == [0.0]
        assert "pid=" not in text

        metrics.process_exited(pids[0])  # its gauges leave the sum, its counters stay
        text = scrape()
        assert _value(text, state) == [1.0]
        assert _value(text, 'stitchrec_requests_total{code="OK",method="Rank"}') == [8.0]
    finally:
        metrics.close()
    assert folder.is_dir()  # the operator's folder is kept


def test_temporary_folder_is_removed_and_a_file_is_refused(tmp_path):
    metrics = AggregatedMetrics()
    folder = Path(metrics.folder)
    assert folder.is_dir() and metrics.owned
    metrics.close()
    assert not folder.exists()
    not_a_folder = tmp_path / "prom"
    not_a_folder.write_text("")
    with pytest.raises(
        ValueError, match=f"PROMETHEUS_MULTIPROC_DIR '{not_a_folder}' is not a folder"
    ):
        AggregatedMetrics(str(not_a_folder))


def test_each_process_removes_its_own_files_and_the_last_one_the_folder(tmp_path):
    folder = tmp_path / "metrics"
    folder.mkdir()
    for name in ("counter_41.db", "gauge_livesum_41.db", "histogram_42.db", "counter_411.db"):
        (folder / name).write_bytes(b"x")
    assert not remove_process_files(str(folder), 41)  # 42's and 411's files stay
    assert sorted(p.name for p in folder.iterdir()) == ["counter_411.db", "histogram_42.db"]
    assert not remove_process_files(str(folder), 42)
    assert remove_process_files(str(folder), 411)
    assert not folder.exists()
    assert remove_process_files(str(folder), 42)  # a worker after the last: nothing to do


def test_workers_mark_only_the_supervisors_temporary_folder_as_theirs_to_remove(tmp_path):
    inherited = {"PATH": "/bin", MULTIPROC_ENV: "/elsewhere", METRICS_TEMPORARY_ENV: "1"}
    assert workers_env(inherited, None) == {"PATH": "/bin"}  # no --metrics-port: no folder
    operator = AggregatedMetrics(str(tmp_path / "operator"))
    env = workers_env(inherited, operator)  # the marker inherited from the supervisor's own env
    assert env == {"PATH": "/bin", MULTIPROC_ENV: str(tmp_path / "operator")}
    temporary = AggregatedMetrics()
    try:
        env = workers_env(inherited, temporary)
        assert env == {"PATH": "/bin", MULTIPROC_ENV: temporary.folder, METRICS_TEMPORARY_ENV: "1"}
    finally:
        temporary.close()
