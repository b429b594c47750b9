"""TFRecord training input: the checksum and record framing against TensorFlow's own writer, the
writer's files and manifest, and ``make_tfrecord_dataset`` against hand-computed expectations
and against ``make_dataset`` on the same Parquet rows."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.dataset import list_parquet, make_dataset
from features.read_report import DataError
from features.schema import load_schema
from features.tfrecord.convert import parquet_to_tfrecord
from features.tfrecord.crc32c import crc32c, masked_crc32c
from features.tfrecord.dataset import make_tfrecord_dataset
from features.tfrecord.encode import frame
from features.tfrecord.manifest import list_tfrecord
from features.tfrecord.writer import TFRecordShardWriter
from tests.testdata import TINY_SCHEMA

ROOT = Path(__file__).resolve().parents[2]

SEQ_SCHEMA = """
name = "seq"

[source]
format = "parquet"

[[fields]]
name = "click"
kind = "label"

[[fields]]
name = "buy"
kind = "label"
defined_on = "click"

[[fields]]
name = "item"
kind = "categorical"
dtype = "int64"

[[fields]]
name = "hist"
kind = "sequence"
max_len = 3

[[fields]]
name = "price"
kind = "numeric"
default = 1.5

[[fields]]
name = "day"
kind = "meta"
"""


def _bitwise_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_and_framing_match_tensorflows_writer(tmp_path):
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    rng = np.random.default_rng(0)
    for n in (0, 1, 63, 64, 65, 1000, 64 * 9 + 5):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c(data) == _bitwise_crc32c(data), n
    records = [b"", b"x", rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()]
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as w:
        for r in records:
            w.write(r)
    ours = b"".join(frame(r) for r in records)
    assert ours == (tmp_path / "tf.tfrecord").read_bytes()
    assert masked_crc32c(b"") == 0xA282EAD8


def _seq_table(rows: int, seed: int) -> pa.Table:
    """Rows with missing cells in every kind of column and a list-typed sequence column."""
    rng = np.random.default_rng(seed)
    click = rng.integers(0, 2, rows).astype(np.float32)
    buy = np.where(click == 1, rng.integers(0, 2, rows), np.nan).astype(np.float32)
    hist = [None if i % 7 == 3 else [f"i{j}" for j in range(i % 4)] for i in range(rows)]
    return pa.table(
        {
            "click": pa.array(click),
            "buy": pa.array(buy, from_pandas=True),
            "item": pa.array([None if i % 5 == 0 else i * 11 for i in range(rows)], pa.int64()),
            "hist": pa.array(hist, pa.list_(pa.string())),
            "price": pa.array([None if i % 6 == 1 else i / 4 for i in range(rows)], pa.float32()),
            "day": pa.array([f"d{i}" for i in range(rows)]),
        }
    )


def _all(ds: tf.data.Dataset) -> tuple[dict[str, np.ndarray], list[int]]:
    batches = list(ds)
    sizes = [int(b["click" if "click" in b else "label"].shape[0]) for b in batches]
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in batches[0]}, sizes


def test_written_shards_hold_what_make_dataset_yields(tmp_path):
    """Missing cells, a Parquet list sequence, two labels and an int64 field through a writer
    whose files (7 rows) and blocks (3 rows) cut across the written batches (5, 1, 9, 2 rows):
    the TFRecord input yields make_dataset's values, dtypes and order, file by file."""
    (tmp_path / "schema.toml").write_text(SEQ_SCHEMA)
    schema = load_schema(tmp_path / "schema.toml").as_parquet()
    table = _seq_table(17, seed=1)
    pq.write_table(table, tmp_path / "rows.parquet")
    writer = TFRecordShardWriter(tmp_path / "tfr", 7, "part", schema=schema, block_rows=3)
    start = 0
    for n in (5, 1, 9, 2):
        writer.write(table.slice(start, n).to_batches()[0])
        start += n
    assert not list((tmp_path / "tfr").glob("*.json"))  # the manifest comes last
    paths = writer.close()
    assert [p.name for p in paths] == [f"part-{i:05d}.tfrecord" for i in range(3)]
    shards = list_tfrecord(tmp_path / "tfr")
    assert [(f.rows, f.records) for f in shards.files] == [(7, 3), (7, 3), (3, 1)]
    assert shards.fields == {
        "item": "int64", "hist": "bytes", "price": "float", "click": "float", "buy": "float"
    }  # fmt: skip
    got, sizes = _all(make_tfrecord_dataset(schema, tmp_path / "tfr", batch_size=4))
    want, _ = _all(make_dataset(schema, tmp_path / "rows.parquet", batch_size=4))
    assert sizes == [4, 4, 4, 4, 1]
    assert set(got) == set(want) == {"item", "hist", "price", "click", "buy"}
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["hist"][:4].tolist() == [b"", b"i0", b"i0|i1", b""]  # a missing list is ""
    assert got["item"][0] == -1 and got["price"][1] == 1.5 and got["buy"][0] == 0.0
    spec = make_tfrecord_dataset(schema, tmp_path / "tfr", batch_size=4).element_spec
    want_spec = make_dataset(schema, tmp_path / "rows.parquet", batch_size=4).element_spec
    assert {k: (v.shape, v.dtype) for k, v in spec.items()} == {
        k: (v.shape, v.dtype) for k, v in want_spec.items()
    }


@pytest.fixture(scope="module")
def tiny_tfrecord(tmp_path_factory, shared_tiny_data):
    """The tiny training rows (4,000, 2 Parquet files) as TFRecord files of 900 rows (5 files,
    the last 400) in blocks of 64 rows."""
    out = tmp_path_factory.mktemp("tfr") / "train"
    schema = load_schema(shared_tiny_data["schema"]).as_parquet()
    parquet_to_tfrecord(
        schema, list_parquet(shared_tiny_data["train"]), out, rows_per_shard=900, block_rows=64
    )
    prices = np.concatenate(
        [
            pq.read_table(f).column("price").to_numpy()
            for f in list_parquet(shared_tiny_data["train"])
        ]
    ).astype(np.float32)
    return schema, out, prices


def _epoch(schema, path, **kw):
    kw = {"batch_size": 256, "shuffle": True, "seed": 1, "epoch": 0, "shuffle_buffer": 1024, **kw}
    return _all(make_tfrecord_dataset(schema, path, **kw))


def _expected_rows(prices: np.ndarray, seed: int, epoch: int, shard=None) -> np.ndarray:
    """The prices of the epoch's rows by hand: file ``i`` holds rows ``[900 i, 900 i + 900)``;
    files in ``default_rng([seed, epoch])`` order, rows concatenated, worker ``w`` of ``W``
    keeping rows ``[w * q, (w + 1) * q)``, ``q = 4000 // W``."""
    order = np.random.default_rng([seed, epoch]).permutation(5)
    rows = np.concatenate([prices[900 * i : 900 * (i + 1)] for i in order])
    if shard is None:
        return rows
    q = len(rows) // shard[1]
    return rows[shard[0] * q : (shard[0] + 1) * q]


def test_every_row_once_in_an_order_fixed_by_seed_and_epoch(tiny_tfrecord):
    schema, path, prices = tiny_tfrecord
    assert [f.rows for f in list_tfrecord(path).files] == [900] * 4 + [400]
    a, sizes = _epoch(schema, path)
    assert sizes == [256] * 15 + [160]
    expected = _expected_rows(prices, 1, 0)
    # windows of 1,024 rows (4 batches): each a permutation of those rows of the file order
    for w in range(4):
        window = slice(w * 1024, (w + 1) * 1024)
        np.testing.assert_array_equal(np.sort(a["price"][window]), np.sort(expected[window]))
    assert not np.array_equal(a["price"], expected)  # shuffled inside the windows
    b, _ = _epoch(schema, path)
    c, _ = _epoch(schema, path, epoch=1)
    d, _ = _epoch(schema, path, seed=2)
    assert a["price"].tolist() == b["price"].tolist()
    assert a["price"].tolist() != c["price"].tolist()
    assert a["price"].tolist() != d["price"].tolist()
    np.testing.assert_array_equal(np.sort(c["price"]), np.sort(prices))
    plain, _ = _epoch(schema, path, shuffle=False)
    np.testing.assert_array_equal(plain["price"], prices)  # files sorted, rows in order


def test_shards_are_the_hand_computed_equal_shares(tiny_tfrecord):
    schema, path, prices = tiny_tfrecord
    for workers in (2, 3):
        seen = []
        for w in range(workers):
            want = _expected_rows(prices, 1, 0, shard=(w, workers))
            full, _ = _epoch(schema, path, shard=(w, workers))
            np.testing.assert_array_equal(np.sort(full["price"]), np.sort(want))
            part, sizes = _epoch(schema, path, shard=(w, workers), drop_remainder=True)
            assert sizes == [256] * (4000 // workers // 256)
            seen.append(part["price"])
        seen = np.concatenate(seen)
        assert len(np.unique(seen)) == len(seen)  # disjoint
    one, _ = _epoch(schema, path, shard=(0, 1))
    assert one["price"].tolist() == _epoch(schema, path)[0]["price"].tolist()


@pytest.mark.parametrize("shard", [None, (1, 2)])
def test_skip_batches_equals_dropping_the_first_batches(tiny_tfrecord, shard):
    schema, path, _ = tiny_tfrecord
    full, sizes = _epoch(schema, path, shard=shard, epoch=2)
    bounds = np.cumsum([0, *sizes])
    for k in (1, 3, 4, 5, len(sizes) - 1):  # windows hold 4 batches
        rest, rest_sizes = _epoch(schema, path, shard=shard, epoch=2, skip_batches=k)
        assert rest_sizes == sizes[k:]
        np.testing.assert_array_equal(rest["price"], full["price"][bounds[k] :])
    for k in (len(sizes), len(sizes) + 3):
        kw = {"shuffle": True, "seed": 1, "epoch": 2, "shuffle_buffer": 1024, "shard": shard}
        assert list(make_tfrecord_dataset(schema, path, batch_size=256, skip_batches=k, **kw)) == []


def _tiny_schema(tmp_path: Path, text: str) -> object:
    (tmp_path / "s.toml").write_text(text)
    return load_schema(tmp_path / "s.toml")


def test_bad_shards_and_schemas_are_named_errors(tiny_tfrecord, tmp_path):
    schema, path, _ = tiny_tfrecord
    with pytest.raises(FileNotFoundError, match="no TFRecord files"):
        make_tfrecord_dataset(schema, tmp_path / "none", batch_size=4)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    shutil.copy(copy / "part-00000.tfrecord", copy / "part-00009.tfrecord")
    with pytest.raises(DataError, match=r"part-00009\.tfrecord: no manifest .* lists it"):
        make_tfrecord_dataset(schema, copy, batch_size=4)
    (copy / "part-00009.tfrecord").unlink()
    with (copy / "part-00001.tfrecord").open("ab") as f:
        f.write(b"x")
    with pytest.raises(DataError, match=r"part-00001\.tfrecord: \d+ bytes, but its manifest"):
        make_tfrecord_dataset(schema, copy, batch_size=4)
    extra = TINY_SCHEMA + '\n[[fields]]\nname = "zzz"\nkind = "numeric"\n'
    with pytest.raises(DataError, match=r"TFRecord shards lack field 'zzz' that schema 'tiny'"):
        make_tfrecord_dataset(_tiny_schema(tmp_path, extra), path, batch_size=4)
    as_text = TINY_SCHEMA.replace('dtype = "int64"\n', "")
    with pytest.raises(DataError, match=r"field 'item' is a int64 list, schema 'tiny' expects a"):
        make_tfrecord_dataset(_tiny_schema(tmp_path, as_text), path, batch_size=4)


def test_a_corrupt_record_fails_its_checksum(tiny_tfrecord, tmp_path):
    schema, path, _ = tiny_tfrecord
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    data = bytearray((copy / "part-00002.tfrecord").read_bytes())
    data[5000] ^= 0xFF  # same size: only the record's CRC can tell
    (copy / "part-00002.tfrecord").write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError, match="corrupted record"):
        list(make_tfrecord_dataset(schema, copy, batch_size=256))


def test_the_writer_is_atomic_and_imports_no_tensorflow(tmp_path, shared_tiny_data):
    code = "import sys, features.tfrecord.writer; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
    schema = load_schema(shared_tiny_data["schema"]).as_parquet()
    table = pq.read_table(list_parquet(shared_tiny_data["train"])[0])
    out_dir = tmp_path / "tfr"
    writer = TFRecordShardWriter(out_dir, 1500, schema=schema, block_rows=100)
    for _ in range(34):  # 66,300 rows: rows are encoded and written past 65,536 pending
        writer.write(table.slice(0, 1950).to_batches()[0])
    done = [f"part-{i:05d}.tfrecord" for i in range(44)]
    assert sorted(p.name for p in out_dir.iterdir()) == [".part-00044.tfrecord.tmp", *done]
    writer.abort()
    assert sorted(p.name for p in out_dir.iterdir()) == done
    with pytest.raises(DataError, match="no manifest"):
        list_tfrecord(out_dir)  # an aborted writer's files are never read
    again = TFRecordShardWriter(out_dir, 1500, schema=schema, block_rows=100)
    assert list(out_dir.iterdir()) == []  # the earlier run's files are gone
    again.write(table.slice(0, 10).to_batches()[0])
    with pytest.raises(DataError, match=r"lacks the columns \['label'\]"):
        again.write(table.drop_columns(["label"]).to_batches()[0])
    assert [p.name for p in again.close()] == ["part-00000.tfrecord"]
    assert list_tfrecord(out_dir).rows == 10
