"""A run's data and statistics (``pipelines.run.data``): the sizing of hashed fields' tables
and the two routes of training input (raw files, or Parquet shards of ``stitchrec convert``)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from features import convert
from features.read_report import DataError
from features.schema import load_schema
from pipelines.config import ConfigError, load_config
from pipelines.run.data import prepare_data, prepare_stats
from pipelines.run.model import build_on_sample, build_run_model
from pipelines.run.paths import RunPaths
from tests.testdata import TINY_SCHEMA, make_tiny_table, write_run_config, write_tiny_dataset

HASHED_USER = TINY_SCHEMA.replace(
    'name = "user"\nkind = "categorical"',
    'name = "user"\nkind = "categorical"\nvocab = "hash"\nhash_buckets = 1000000',
)


def _hashed_run(tmp_path, data_extra=""):
    data = write_tiny_dataset(tmp_path, rows=300, train_rows=200)
    data["schema"].write_text(HASHED_USER)
    model = {"type": "lr"}
    config = write_run_config(
        tmp_path / "c.toml", data, tmp_path / "run", model, {}, "", data_extra
    )
    cfg = load_config(config)
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    paths.config.write_text(cfg.to_toml())
    return cfg, paths


@pytest.mark.parametrize("cap", [True, False])
def test_hashed_table_is_capped_to_the_training_values_unless_switched_off(tmp_path, cap):
    cfg, paths = _hashed_run(tmp_path, "" if cap else "cap_hash_buckets = false")
    lines = []
    schema, train, _, _ = prepare_data(cfg, paths, lines.append)
    stats = prepare_stats(schema, train, paths, lines.append, cfg.data.cap_hash_buckets)
    model = build_run_model(cfg, schema, stats)
    distinct = stats["user"].num_distinct
    assert 30 < distinct <= 40  # users u0..u39 in the training split: the floor of 1024 rows
    rows = 1024 if cap else 1_000_000
    assert model.preprocessor.embedded_fields["user"] == rows
    build_on_sample(model, schema, train)
    tables = sorted(w.shape[0] for w in model.weights if w.name.endswith("table:0"))
    assert tables == [4, 5, 21, rows]  # tags, age buckets, item vocabulary, hashed user
    capped = [line for line in lines if line.startswith("field user:")]
    assert capped == (
        [
            f"field user: hash_buckets 1000000 capped to 1024 ({distinct} distinct values in the "
            "training rows; [data] cap_hash_buckets = false keeps the schema's value)"
        ]
        if cap
        else []
    )
    # the rows are saved with the statistics: read back, they build the same table
    again = prepare_stats(schema, train, paths, lines.append, cfg.data.cap_hash_buckets)
    assert build_run_model(cfg, schema, again).preprocessor.embedded_fields["user"] == rows


def test_cap_hash_buckets_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match="cap_hash_buckets must be true or false"):
        _hashed_run(tmp_path, 'cap_hash_buckets = "no"')


CSV_SCHEMA = TINY_SCHEMA.replace('format = "parquet"', 'format = "csv"')


def _csv_run(tmp_path, name, train, test):
    """A run over the CSV schema with ``[data] train``/``test`` as given; its data prepared."""
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'output_dir = "{name}"\n[data]\nschema = "schema.toml"\n'
        f"train = {[str(f) for f in train]}\ntest = {[str(f) for f in test]}\n"
    )
    lines = []
    data = prepare_data(load_config(config), RunPaths(tmp_path / name), lines.append)
    return data, lines


def _rows(files):
    return sum(pq.read_metadata(f).num_rows for f in files)


def test_raw_csv_files_and_their_converted_shards_give_the_same_split(tmp_path):
    (tmp_path / "schema.toml").write_text(CSV_SCHEMA)
    make_tiny_table(400).to_pandas().to_csv(tmp_path / "train.csv", index=False)
    make_tiny_table(100, seed=1).to_pandas().to_csv(tmp_path / "test.csv", index=False)
    raw, lines = _csv_run(tmp_path, "raw", [tmp_path / "train.csv"], [tmp_path / "test.csv"])
    assert "converting 1 raw training input(s) to the run's Parquet shards" in lines[0]
    assert not any("Parquet inputs" in line for line in lines)
    schema = load_schema(tmp_path / "schema.toml")
    for split in ("train", "test"):  # what `stitchrec convert` writes
        convert.convert(schema, [tmp_path / f"{split}.csv"], tmp_path / f"pq_{split}")
    converted, lines = _csv_run(
        tmp_path, "pq", [tmp_path / "pq_train" / "train"], [tmp_path / "pq_test" / "train"]
    )
    assert "converting 1 Parquet training input(s)" in lines[0]
    assert converted.schema == raw.schema == schema.as_parquet()
    for a, b in zip(raw[1:], converted[1:], strict=True):  # the same rows in each split
        assert pq.read_table(a).to_pylist() == pq.read_table(b).to_pylist()
    assert (_rows(raw.train), _rows(raw.validation), _rows(raw.test)) == (364, 36, 100)
    with pytest.raises(DataError, match=r"mix Parquet shards .* and raw files .*test\.csv"):
        _csv_run(tmp_path, "mixed", [tmp_path / "pq_train" / "train"], [tmp_path / "test.csv"])
