"""Score sources: Parquet score files aligned by row id (and their errors), the logs reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.evaluation import compare, sources
from pipelines.evaluation.tasks import ModelTask
from tests.testdata import TINY_SCHEMA, make_tiny_table


@pytest.fixture()
def logs_dir(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "schema.toml").write_text(TINY_SCHEMA)
    pq.write_table(make_tiny_table(300), d / "part-00000.parquet")
    return d


def _scores(path, ids, values, **cols):
    pq.write_table(pa.table({"row_id": ids, "score": values, **cols}), path)
    return str(path)


def test_logs_find_schema_beside_shards_and_number_rows(logs_dir):
    logs = sources.load_logs([str(logs_dir)])
    assert logs.n == 300 and logs.schema.name == "tiny"
    np.testing.assert_array_equal(logs.row_ids, np.arange(300))
    expected = make_tiny_table(300).column("label").to_numpy()
    np.testing.assert_array_equal(logs.labels, expected)


def test_scores_file_is_aligned_by_row_id(logs_dir, tmp_path):
    logs = sources.load_logs([str(logs_dir)])
    perm = np.random.default_rng(0).permutation(300)
    values = np.linspace(0.01, 0.99, 300)
    src = sources.open_source(_scores(tmp_path / "s.parquet", perm, values[perm]))
    np.testing.assert_array_equal(src.scores(logs), values)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (
            np.arange(299),
            r"misaligned with the logs: 1 of 300 logged rows have no score \(first row id 299\)",
        ),
        (
            np.arange(301),
            r"it has 301 rows but the logs have 300; 1 of its row ids are not in the logs \(first 300\)",
        ),
        (np.r_[np.arange(299), 5], r"1 duplicate row ids \(first 5\)"),
    ],
)
def test_misaligned_scores_files_are_named(logs_dir, tmp_path, ids, match):
    logs = sources.load_logs([str(logs_dir)])
    src = sources.open_source(_scores(tmp_path / "s.parquet", ids, np.full(ids.size, 0.5)))
    with pytest.raises(sources.SourceError, match=match):
        src.scores(logs)


def test_a_predict_output_folder_is_a_scores_source_with_a_column_per_task(logs_dir, tmp_path):
    logs = sources.load_logs([str(logs_dir)])
    folder = tmp_path / "scores"
    folder.mkdir()
    ids = np.random.default_rng(1).permutation(300)
    click, buy = np.linspace(0.1, 0.9, 300), np.linspace(0.9, 0.1, 300)
    for k, part in enumerate(np.array_split(ids, 3)):
        _scores(folder / f"part-{k:05d}.parquet", part, click[part], score_buy=buy[part])
    with pytest.raises(sources.SourceError, match="neither a SavedModel directory"):
        sources.open_source(str(folder))  # no _SUCCESS: an unfinished predict is not read
    (folder / "_SUCCESS").write_text("{}")
    src = sources.open_source(str(folder))
    np.testing.assert_array_equal(src.scores(logs), click)
    task = ModelTask(name="buy", label="label", output="score_buy")
    np.testing.assert_array_equal(src.for_task(task).scores(logs), buy)
    np.testing.assert_array_equal(src.for_task(ModelTask("label", "label")).scores(logs), click)


def test_missing_columns_and_unknown_sources(logs_dir, tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": np.arange(3), "p": np.zeros(3)}), path)
    with pytest.raises(sources.SourceError, match=r"has no column 'row_id'; it has \['id', 'p'\]"):
        sources.open_source(str(path))
    src = sources.open_source(str(path), id_column="id", score_column="p")
    assert src.values.size == 3
    with pytest.raises(FileNotFoundError, match="expected a SavedModel directory"):
        sources.open_source(str(tmp_path / "nothing"))
    with pytest.raises(sources.SourceError, match="neither a SavedModel directory"):
        sources.open_source(str(logs_dir))
    with pytest.raises(sources.SourceError, match="expected grpc://HOST:PORT/MODEL"):
        sources.open_source("grpc://localhost/ctr")


def test_nan_scores_in_a_file_are_reported_with_the_row(logs_dir, tmp_path):
    logs = sources.load_logs([str(logs_dir)])
    values = np.full(300, 0.3)
    values[17] = np.nan
    src = sources.open_source(_scores(tmp_path / "s.parquet", np.arange(300), values))
    with pytest.raises(ValueError, match=r"treatment scores: 1 scores are NaN .* first at row 17"):
        compare.compare_scores(logs.labels, np.full(300, 0.3), src.scores(logs), resamples=0)


def test_long_scores_file_gives_logged_action_scores(logs_dir, tmp_path):
    logs = sources.load_logs([str(logs_dir)])
    items = logs.column("item")
    cands = np.unique(items)
    ids = np.repeat(np.arange(300), cands.size)
    acts = np.tile(cands, 300)
    val = (ids % 7 + acts) / 100.0
    src = sources.open_source(_scores(tmp_path / "s.parquet", ids, val, item=acts), action="item")
    np.testing.assert_allclose(src.scores(logs), (np.arange(300) % 7 + items) / 100.0)
    full = src.candidate_scores(logs, "item", cands, None)
    assert full.shape == (300, cands.size)
    np.testing.assert_allclose(full[3], (3 + cands) / 100.0)


def test_single_class_and_small_slices_are_flagged_not_dropped():
    rng = np.random.default_rng(0)
    n = 1000
    seg = np.where(np.arange(n) < 40, "small", np.where(np.arange(n) < 300, "quiet", "big"))
    y = (rng.random(n) < 0.3).astype(float)
    y[40:300] = 0  # "quiet": no clicks at all
    a, b = rng.random(n), rng.random(n)
    r = compare.compare_scores(y, a, b, slices={"seg": seg}, resamples=50, min_slice_rows=100)
    got = {e["value"]: e for e in r["slices"]["seg"]["slices"]}
    assert set(got) == {"small", "quiet", "big"}
    assert got["small"]["flags"] == ["too few rows (40 < 100)"]
    assert got["quiet"]["flags"] == ["single class (no clicks): AUC undefined"]
    assert got["quiet"]["metrics"]["auc"]["verdict"] == "undefined"
    assert got["quiet"]["metrics"]["logloss"]["ci_low"] is not None  # still computed
    assert got["big"]["flags"] == [] and r["slices"]["seg"]["flagged"] == 2
