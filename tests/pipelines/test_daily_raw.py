"""`stitchrec daily` on windows of raw CSV files (as `stitchrec windows` writes them): the
config's schema reads them, the run splits its own test rows off, and both the candidate and the
served version are scored on those rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from pipelines.daily import DailyOptions, run_daily
from tests.testdata import TINY_SCHEMA, make_tiny_table

CONFIG = """\
output_dir = "runs"

[data]
schema = "tiny_csv.toml"
test_fraction = 0.25
validation_fraction = 0.2

[model]
type = "dnn"
embedding_dim = 4
mlp = [8]

[train]
batch_size = 128
epochs = 1
checkpoint_every = 100
log_every = 100
"""


def _window(folder: Path, seed: int, user_shift: int) -> Path:
    """A window of one CSV file: the tiny log of ``seed`` with user ``u{k}`` renamed
    ``u{k + user_shift}`` (new users arrive, others leave)."""
    t = make_tiny_table(1200, seed=seed)
    k = pc.cast(pc.utf8_slice_codeunits(t["user"], 1), pa.int64())
    users = pc.binary_join_element_wise("u", pc.cast(pc.add(k, user_shift), pa.string()), "")
    t = t.set_column(0, "user", users)
    folder.mkdir(parents=True)
    pcsv.write_csv(t, folder / "part-00000.csv")
    return folder


def test_raw_windows_train_score_and_export_on_the_runs_own_test_rows(tmp_path):
    schema = TINY_SCHEMA.replace('format = "parquet"', 'format = "csv"\nheader = true')
    (tmp_path / "tiny_csv.toml").write_text(schema)
    (tmp_path / "daily.toml").write_text(CONFIG)
    windows = [_window(tmp_path / "w" / f"d{i}", i, 10 * i) for i in (1, 2)]
    reports = []
    for w in windows:
        opts = DailyOptions(
            config=str(tmp_path / "daily.toml"),
            window=str(w),
            repo=str(tmp_path / "models" / "ctr"),
            runs=str(tmp_path / "runs"),
            rule="always",
        )
        reports.append(run_daily(opts, log=lambda _: None))
    assert [r["version"] for r in reports] == [1, 2]
    second = tmp_path / "runs" / "day-d2"
    test_rows = sum(
        pq.read_metadata(p).num_rows for p in (second / "data" / "test").glob("*.parquet")
    )
    assert 0 < test_rows < 1200
    assert reports[1]["rows"] == test_rows
    assert reports[1]["continued_from"] == str(tmp_path / "runs" / "day-d1")
    meta = json.loads(
        (tmp_path / "models" / "ctr" / "2" / "assets.extra" / "stitchrec.json").read_text()
    )
    assert meta["daily"]["run"] == str(second)
