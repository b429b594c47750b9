"""``[data] input_format`` (``pipelines.run.train_input``): the TFRecord shards of a run's
training split are written once, reused by a resumed run, written again when their source
changed or their conversion was cut short, and read with the rows of the Parquet shards."""

from __future__ import annotations

import numpy as np
import pytest

from features.dataset import list_parquet, make_dataset
from features.schema import load_schema
from pipelines.config import ConfigError, load_config
from pipelines.run.paths import RunPaths
from pipelines.run.train_input import prepare_train_input
from tests.testdata import write_run_config


def test_input_format_is_checked(tmp_path, shared_tiny_data):
    def cfg(line: str):
        path = write_run_config(
            tmp_path / "c.toml", shared_tiny_data, tmp_path / "run", {}, {}, data_extra=line
        )
        return load_config(path)

    assert cfg("").data.input_format == "parquet"
    assert cfg('input_format = "tfrecord"').data.input_format == "tfrecord"
    with pytest.raises(ConfigError, match=r"\[data\] input_format 'arrow' is not one of"):
        cfg('input_format = "arrow"')
    with pytest.raises(ConfigError, match="input_format"):
        cfg("input_format = 1")


def test_tfrecord_shards_are_written_once_and_again_when_stale(tmp_path, shared_tiny_data):
    schema = load_schema(shared_tiny_data["schema"]).as_parquet()
    parquet = list_parquet(shared_tiny_data["train"])
    paths = RunPaths(tmp_path / "run")
    lines: list[str] = []
    first = prepare_train_input("tfrecord", schema, parquet, paths, lines.append)
    assert first.rows == 4000 and first.worker_side
    assert [p.parent for p in first.files] == [paths.data / "tfrecord" / "train"]
    assert sum("as 1 TFRecord file(s)" in line for line in lines) == 1
    stamp = first.files[0].stat().st_mtime_ns
    again = prepare_train_input("tfrecord", schema, parquet, paths, lines.append)
    assert again == first and again.files[0].stat().st_mtime_ns == stamp  # reused
    assert sum("TFRecord file(s)" in line for line in lines) == 1
    # another source (one Parquet file fewer): written again
    fewer = prepare_train_input("tfrecord", schema, parquet[:1], paths, lines.append)
    assert fewer.rows == 2000
    # a conversion cut short (no manifest): written again
    (paths.data / "tfrecord" / "train" / "part.tfrecord.json").unlink()
    redone = prepare_train_input("tfrecord", schema, parquet[:1], paths, lines.append)
    assert redone.rows == 2000 and sum("TFRecord file(s)" in line for line in lines) == 3
    kw = {"batch_size": 500, "shuffle": False}
    got = np.concatenate([b["price"] for b in redone.reader(schema)(**kw)])
    want = np.concatenate([b["price"] for b in make_dataset(schema, parquet[:1], **kw)])
    np.testing.assert_array_equal(got, want)
    plain = prepare_train_input("parquet", schema, parquet, paths, lines.append)
    assert (plain.files, plain.rows, plain.worker_side) == (parquet, 4000, False)
