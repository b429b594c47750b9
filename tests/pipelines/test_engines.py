"""The data jobs on a real Dask cluster (a scheduler and two workers on 127.0.0.1, started by the
tests) give exactly what one process gives: convert's shards byte for byte, its bad-row counts
and errors, statistics, the PCF pair graph, the interaction screen and batch scores, also when a
worker is killed mid-job."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features import synthetic, synthetic_config
from features.convert import convert
from features.crosses import interaction_screen as isc
from features.crosses.pcf_build import build_graph
from features.schema import load_schema
from features.stats_job import raw_stats, shard_stats
from features.tasks import JobError, LocalRunner, lanes
from features.tfrecord.convert import parquet_to_tfrecord
from pipelines import cli
from pipelines.config_sections import ConfigError, EngineConfig
from pipelines.engines import DaskRunner, open_runner
from serving.testing import SCHEMA, reference_score, write_linear_model
from tests.dask_cluster import (
    BLOCK_BYTES,
    ROOT,
    block_of,
    exit_process,
    join_blocks,
    logged_merge,
    logged_task,
    ranges_merge,
    start_cluster,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: lines made bad in train.tsv (0-based line indices) and how
BAD_LINES = {40: "text", 3_100: "short", 7_777: "label", 12_345: "text", 19_000: "short"}
CHUNK_MB = "0.25"  # about 20 chunks of the 5 MB file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = start_cluster(tmp_path_factory.mktemp("dask"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def raw_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20,000 synthetic rows in the Criteo TSV layout, five of them bad."""
    root = tmp_path_factory.mktemp("log")
    cfg = synthetic_config.SyntheticConfig(rows=20_000, seed=5)
    synthetic.write_dataset(cfg, root / "gen", test_fraction=0.0, criteo_tsv=True)
    lines = (root / "gen" / "train.tsv").read_bytes().split(b"\n")
    for i, how in BAD_LINES.items():
        cols = lines[i].split(b"\t")
        if how == "text":
            cols[3] = b"three"
        elif how == "short":
            cols = cols[:-2]
        else:
            cols[0] = b"7"
        lines[i] = b"\t".join(cols)
    (root / "log.tsv").write_bytes(b"\n".join(lines))
    return root / "log.tsv"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys; from pipelines import cli; sys.exit(cli.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600
    )


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.parquet"))
    }


def test_convert_on_a_cluster_writes_the_bytes_one_process_writes(cluster, raw_log, tmp_path):
    common = ["convert", "--schema", "criteo", "--input", str(raw_log), "--chunk-mb", CHUNK_MB]
    common += ["--test-fraction", "0.2", "--max-bad-rows", "10"]
    runs = {
        "local": [],
        "cluster": ["--cluster", cluster.address],
        "local_cluster": ["--engine", "dask", "--workers", "2"],
    }
    out = {}
    for name, extra in runs.items():
        res = _cli(*common, "--output", str(tmp_path / name), *extra)
        assert res.returncode == 0, res.stderr
        out[name] = res.stdout
    local = _digests(tmp_path / "local")
    assert sorted(local) == ["test/part-00000.parquet", "train/part-00000.parquet"]
    assert _digests(tmp_path / "cluster") == local
    assert _digests(tmp_path / "local_cluster") == local
    summary = [line for line in out["local"].splitlines() if line.startswith("rows: ")]
    assert summary[0].startswith("rows: 19,995; bad rows skipped: 5;")
    for name in ("cluster", "local_cluster"):
        lines = out[name].splitlines()
        assert next(ln for ln in lines if ln.startswith("rows: ")).startswith(
            "rows: 19,995; bad rows skipped: 5;"
        )
        assert "dashboard http://" in out[name]
        skipped = [ln for ln in out[name].splitlines() if ln.startswith("  skipped: ")]
        assert skipped == [ln for ln in out["local"].splitlines() if ln.startswith("  skipped: ")]
    rows = pq.read_table(tmp_path / "local" / "train").num_rows
    rows += pq.read_table(tmp_path / "local" / "test").num_rows
    assert rows == 19_995


def test_a_bad_row_past_the_budget_fails_with_the_message_of_one_process(
    cluster, raw_log, tmp_path
):
    common = ["convert", "--schema", "criteo", "--input", str(raw_log), "--chunk-mb", CHUNK_MB]
    common += ["--max-bad-rows", "3"]
    local = _cli(*common, "--output", str(tmp_path / "a"))
    remote = _cli(*common, "--output", str(tmp_path / "b"), "--cluster", cluster.address)
    assert local.returncode == remote.returncode == 2
    line = local.stderr.strip().splitlines()
    assert len(line) == 1
    # the 4th bad row in input order is line 12,346 (1-based), whichever worker read it first
    assert line[0].startswith("error: more than max_bad_rows = 3 bad rows (limit exceeded); bad ")
    assert f"{raw_log}: line 12346, column 'I3'" in line[0]
    assert remote.stderr.strip().splitlines()[-1] == line[0]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _stats_text(stats, folder: Path) -> dict[str, bytes]:
    stats.save(folder)
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_stats_graph_screen_and_tfrecord_on_a_cluster_equal_one_process(cluster, raw_log, tmp_path):
    schema = load_schema("criteo")
    shards = tmp_path / "shards"
    convert(schema, raw_log, shards, max_bad_rows=10, rows_per_shard=4_000)
    files = sorted((shards / "train").glob("*.parquet"))
    pschema = schema.as_parquet()
    local = LocalRunner()
    with open_runner(EngineConfig("dask", address=cluster.address), lambda _: None) as dask:
        for i, runner in enumerate((local, dask)):
            raw = raw_stats(schema, raw_log, runner=runner, max_bad_rows=10, chunk_bytes=250_000)
            part = shard_stats(pschema, files, runner=runner, part_rows=1)
            graph = build_graph(pschema, files, [("C1", "C2"), ("C3", "C14")], runner=runner)
            ids = np.random.default_rng(0).integers(0, 5, size=(3_000, 6))
            y = (ids[:, 0] == ids[:, 1]).astype(np.float64)
            tested, _ = isc.screen(ids, y, list("abcdef"), 3, 64, runner=runner)
            tfrecord = tmp_path / f"tfrecord{i}"
            parquet_to_tfrecord(pschema, files, tfrecord, rows_per_shard=6_000, runner=runner)
            result = (
                _stats_text(raw, tmp_path / f"raw{i}"),
                _stats_text(part, tmp_path / f"part{i}"),
                [(r.pair, r.u.tolist(), r.v.tolist(), r.clicks.tolist()) for r in graph.relations],
                graph.vocab,
                [(c.fields, c.z, c.effect, c.df) for c in tested],
                {p.name: p.read_bytes() for p in sorted(tfrecord.iterdir())},
            )
            if i == 0:
                expected = result
    assert result == expected
    assert part.rows == 19_995 and graph.rows == 19_995
    assert len(tested) == 20
    assert sorted(result[-1]) == [f"part-{k:05d}.tfrecord" for k in range(4)] + [
        "part.tfrecord.json"
    ]  # 19,995 rows in files of 6,000


def test_predict_on_a_cluster_scores_like_one_process_and_by_hand(cluster, tmp_path):
    model = write_linear_model(tmp_path / "model", bias=-1.0)
    schema_asset = model / "assets.extra" / "schema.toml"  # an export's schema has a label
    schema_asset.write_text(SCHEMA + '\n[[fields]]\nname = "click"\nkind = "label"\n')
    rng = np.random.default_rng(1)
    logs = tmp_path / "logs"
    logs.mkdir()
    frames = []
    for k in range(3):
        n = 500 + 100 * k
        t = pa.table(
            {
                "user": pa.array([f"u{u}" for u in rng.integers(0, 3, n)]),
                "item": pa.array(rng.integers(0, 5, n), pa.int64()),
                "price": pa.array(rng.random(n).astype(np.float32)),
            }
        )
        pq.write_table(t, logs / f"part-{k:05d}.parquet")
        frames.append(t)
    for name, extra in (("local", []), ("cluster", ["--cluster", cluster.address])):
        res = _cli(
            "predict", "--model", str(model), "--data", str(logs), "--output",
            str(tmp_path / name), *extra,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    local = pq.read_table(tmp_path / "local")
    assert pq.read_table(tmp_path / "cluster").equals(local)
    assert sorted(p.name for p in (tmp_path / "cluster").iterdir())[:2] == [
        "_SUCCESS",
        "part-00000.parquet",
    ]
    rows = pa.concat_tables(frames)
    assert local.column("row_id").to_pylist() == list(range(rows.num_rows))
    want = [
        reference_score(-1.0, u, i, p)
        for u, i, p in zip(
            *(rows.column(c).to_pylist() for c in ("user", "item", "price")), strict=True
        )
    ]
    np.testing.assert_allclose(local.column("score").to_numpy(), want, rtol=1e-5)
    res = _cli(
        "predict", "--model", str(model), "--data", str(logs), "--output",
        str(tmp_path / "by-user"), "--row-id", "user", "--cluster", cluster.address,
    )  # fmt: skip
    counts = pc.value_counts(rows.column("user"))  # the ids counted in one process
    first = rows.column("user")[0].as_py()
    n = pc.sum(pc.equal(rows.column("user"), first)).as_py()
    assert res.returncode == 2 and (
        f"--row-id 'user': {len(counts)} distinct values in 1,800 rows ({first!r} on {n:,} rows)"
        in res.stderr
    ), res.stderr


def test_a_worker_killed_mid_job_leaves_the_shards_unchanged(raw_log, tmp_path):
    schema = load_schema("criteo")
    kw = {"max_bad_rows": 10, "test_fraction": 0.2, "chunk_bytes": 60_000}
    convert(schema, raw_log, tmp_path / "local", **kw)
    c = start_cluster(tmp_path / "dask")
    try:
        victim = c.worker_pids()[0]
        out = tmp_path / "cluster"
        done: list[object] = []
        with open_runner(EngineConfig("dask", address=c.address), lambda _: None) as runner:

            def job() -> None:
                try:
                    done.append(convert(schema, raw_log, out, runner=runner, **kw))
                except BaseException as e:  # reported by the assertion below
                    done.append(e)

            thread = threading.Thread(target=job)
            thread.start()
            deadline = time.monotonic() + 120
            while not list(out.glob(".chunks-*/chunk-*.arrow")) and time.monotonic() < deadline:
                time.sleep(0.02)
            written = len(list(out.glob(".chunks-*/chunk-*.arrow")))
            os.kill(victim, signal.SIGKILL)
            thread.join(timeout=300)
        assert 0 < written < 90, written  # about 90 chunks: the kill came mid-job
        assert len(done) == 1 and isinstance(done[0], dict), done
        assert victim not in c.worker_pids()  # the nanny started a new worker process
    finally:
        c.stop()
    assert _digests(tmp_path / "cluster") == _digests(tmp_path / "local")


def test_a_task_whose_workers_keep_dying_is_one_job_error(tmp_path):
    c = start_cluster(tmp_path / "dask", workers=1, allowed_failures=1)
    try:
        with (
            open_runner(EngineConfig("dask", address=c.address), lambda _: None) as runner,
            pytest.raises(JobError, match=r"^dying: task 1 of 1 failed: the workers "),
        ):
            runner.map(exit_process, [None], label="dying")
    finally:
        c.stop()


def test_a_job_on_a_cluster_without_workers_fails_after_the_wait(tmp_path):
    c = start_cluster(tmp_path / "dask", workers=1)
    try:
        workers = c.worker_pids()
        c.processes[1].kill()  # the nanny, then its worker: nothing starts it again
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        config = EngineConfig("dask", address=c.address, no_workers_seconds=2)
        t0 = time.monotonic()
        with (
            open_runner(config, lambda _: None) as runner,
            pytest.raises(JobError, match=r"^lonely: task 1 of 1 could not run: .* has had no "),
        ):
            runner.map(str, [1], label="lonely")
        assert 2 <= time.monotonic() - t0 < 60
    finally:
        c.stop()


@pytest.mark.parametrize("key", ["no_workers_seconds", "connect_seconds"])
@pytest.mark.parametrize("value", [0, -1.5, "60", True])
def test_the_waits_must_be_positive_numbers(key, value):
    with pytest.raises(ConfigError, match=rf"\[engine\] {key} must be a number of seconds > 0"):
        EngineConfig("dask", **{key: value})


def test_a_result_that_takes_longer_than_a_poll_to_arrive_arrives(cluster):
    """The runner checks for workers every ``poll_s`` while it waits; a result whose transfer
    takes longer than that (here 128 MiB against 50 ms; a large job's statistics take seconds
    against the default 1 s) is fetched once, not abandoned and fetched again forever."""
    import distributed

    client = distributed.Client(cluster.address, timeout="10s", set_as_default=False)
    runner = DaskRunner(client, 0, cluster.address, 60.0, poll_s=0.05)
    got: list[bytes] = []
    try:
        worker = threading.Thread(
            target=lambda: got.append(runner.map_reduce(block_of, [1, 2], join_blocks)),
            daemon=True,
        )
        worker.start()
        worker.join(60)
        assert got, "the result never arrived"
        assert got[0] == bytes([1]) * BLOCK_BYTES + bytes([2]) * BLOCK_BYTES
        assert runner.map(block_of, [3]) == [bytes([3]) * BLOCK_BYTES]
    finally:
        client.close()


def test_map_reduce_on_a_cluster_folds_a_lane_per_worker_in_order(cluster, tmp_path):
    """40 tasks on two workers: each worker's lane of 20 tasks is folded task by task (every
    merge adds one task's result to the running result of the tasks before it), then the two
    lanes are merged; nothing waits for a sibling subtree, so what a worker holds does not
    grow with the number of tasks."""
    import distributed

    log = tmp_path / "ranges"
    client = distributed.Client(cluster.address, timeout="10s", set_as_default=False)
    try:
        workers = len(client.scheduler_info()["workers"])
        runner = DaskRunner(client, 0, cluster.address, 60.0)
        _, order = runner.map_reduce(logged_task, list(range(40)), ranges_merge, shared=str(log))
    finally:
        client.close()
    assert order == list(range(40)) and workers == 2
    merges = sorted(tuple(int(n) for n in line.split()) for line in log.read_text().splitlines())
    folds = [(lo, i - 1, i, i) for lo, hi in lanes(40, 2) for i in range(lo + 1, hi)]
    assert merges == sorted([*folds, (0, 19, 20, 39)])


def test_map_reduce_on_a_cluster_frees_what_it_merged(cluster, tmp_path):
    """32 tasks of 0.1 s on two workers: each result is freed once merged, so a worker holds a
    few results at once (its lane's running result, the shared object, the results not yet
    merged and the inputs of a merge), not one per task it ran; the result is every task's, in
    task order."""
    log = tmp_path / "held"
    with open_runner(EngineConfig("dask", address=cluster.address), lambda _: None) as runner:
        _, order = runner.map_reduce(logged_task, list(range(32)), logged_merge, shared=str(log))
    assert order == list(range(32))
    held = [int(n) for n in log.read_text().split()]
    assert len(held) == 31  # one line per merge
    assert max(held) <= 12, f"a worker held {max(held)} results"


def test_a_job_error_ends_the_command_with_exit_status_3():
    error = JobError("convert: read chunks: task 3 of 9 failed: the workers running it died")
    assert cli.exit_status(error) == 3
