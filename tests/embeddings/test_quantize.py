"""Row-wise quantized serving tables (embeddings.quantize): the int8 / fp16 arithmetic by hand,
every embedding method's quantized form against its float32 form, the mixed small-table policy,
the config and SavedModel round trips and the argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from compiler_opt.fused_signature import FusedSignature, FusionSpec
from embeddings.collection import EMBEDDING_METHODS, EmbeddingCollection
from embeddings.quantize import (
    QuantizedEmbedding,
    QuantizedTable,
    dequantize_rows,
    quantize_ragged,
    quantize_rows,
    quantized_form,
    quantized_layer,
    quantized_model,
)
from pipelines.export import saved_model_bytes
from tests.compiler_opt.conftest import HAND
from tests.embeddings.roundtrip import assert_saved_model_round_trip, layer_module


def test_int8_rows_by_hand():
    table = np.array([[-1.0, 0.0, 1.55], [3.0, 3.0, 3.0], [0.0, 0.51, 0.2]], np.float32)
    q, scale, offset = quantize_rows(table, "int8")
    assert q.dtype == np.int8 and scale.dtype == np.float16 and offset.dtype == np.float16
    # row 0: scale (1.55 - -1) / 255 = 0.01, rounded up to float16 (0.010002);
    # (x + 1) / scale = 0, 99.98, 254.95 -> 0, 100, 255 -> minus 128
    np.testing.assert_array_equal(q[0], [-128, -28, 127])
    # row 1 is constant: scale 0, every code -128, the value comes back exactly
    np.testing.assert_array_equal(q[1], [-128, -128, -128])
    # row 2: scale 0.51 / 255 = 0.002 (float16 0.0020008); 0.2 / scale = 99.96 -> 100
    np.testing.assert_array_equal(q[2], [-128, 127, -28])
    exact = np.array([0.01, 0.0, 0.002])
    np.testing.assert_allclose(scale, exact, rtol=1e-3)
    assert np.all(scale.astype(np.float64) >= exact)  # rounded up: codes stay in range
    np.testing.assert_array_equal(offset, [-1.0, 3.0, 0.0])
    back = dequantize_rows(q, scale, offset)
    assert back[1].tolist() == [3.0, 3.0, 3.0]
    assert np.all(np.abs(back - table) <= scale[:, None] / 2 + 1e-6)


def test_int8_round_trip_error_is_at_most_half_a_step_per_element():
    # more rows than one chunk of the float64 arithmetic (65,536)
    table = np.random.default_rng(0).normal(0, 0.3, (70_000, 4)).astype(np.float32)
    q, scale, offset = quantize_rows(table, "int8")
    err = np.abs(dequantize_rows(q, scale, offset) - table)
    assert np.all(err <= scale[:, None] * (0.5 + 1e-4) + 1e-7)
    assert q.min() == -128 and q.max() == 127  # each row spans the whole code range


def test_fp16_rows_and_a_ragged_table_by_hand():
    q, scale, offset = quantize_rows(np.array([[1 / 3, -2.0]], np.float32), "fp16")
    assert q.dtype == np.float16 and scale is None and offset is None
    np.testing.assert_array_equal(q, np.array([[1 / 3, -2.0]], np.float16))
    # rows [0, 1] and [5] (a one-entry row: scale 0) of a compact AMTL-like table
    q, scale, offset = quantize_ragged(np.array([0.0, 1.0, 5.0]), np.array([0, 2, 3]), "int8")
    np.testing.assert_array_equal(q, [-128, 127, -128])
    np.testing.assert_allclose(scale, [1 / 255, 0.0], rtol=1e-3)
    np.testing.assert_array_equal(offset, [0.0, 5.0])


METHODS = [
    ("full", {}),
    ("hashing", {"buckets": 300}),
    ("qr", {"collisions": 16}),
    ("qr", {"collisions": 16, "operation": "concat"}),
    ("bh", {"block_bits": 4}),
    ("bh", {"block_bits": 6, "fusion": "concat"}),  # 2 blocks of 4
    ("amtl", {}),
]


def _layer(method: str, options: dict, rows: int = 1000, dim: int = 8):
    layer = EMBEDDING_METHODS[method](rows, dim, name="emb", **options)
    layer(tf.constant([0], tf.int64))  # built
    rng = np.random.default_rng(1)
    for w in layer.trainable_weights:
        if w.shape.rank == 2 and "aml" not in w.name:  # the tables, not the AMTL MLPs
            w.assign(rng.normal(0.5 if "remainder" in w.name else 0.0, 0.1, w.shape))
    return layer.serving_form() if method == "amtl" else layer


def _ids(rows: int = 1000) -> tuple[tf.Tensor, tf.RaggedTensor]:
    rng = np.random.default_rng(2)
    dense = tf.constant(rng.integers(-5, rows + 200, 256), tf.int64)  # OOV and unseen ids too
    ragged = tf.RaggedTensor.from_row_lengths(dense, [100, 0, 56, 100])
    return dense, ragged


@pytest.mark.parametrize(("method", "options"), METHODS)
@pytest.mark.parametrize("mode", ["int8", "fp16"])
def test_every_method_quantized_scores_within_the_quantization_error(method, options, mode):
    layer = _layer(method, options)
    quantized, records = quantized_layer(layer, mode, min_rows=0)
    assert isinstance(quantized, QuantizedEmbedding)
    assert all(r["mode"] == mode and r["bytes"] < r["bytes_fp32"] for r in records)
    # an element reads at most two rows (qr mult: q * r) or n_blocks rows (bh sum), each off
    # by half a step of its row (int8) or a float16 rounding
    step = 0.5 * 1.0 / 255 if mode == "int8" else 1e-3  # rows of N(0, 0.1) span < 1.0
    reads = getattr(layer, "n_blocks", 2) if options.get("fusion") != "concat" else 1
    for ids in _ids():
        want, got = layer(ids).numpy(), quantized(ids).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=reads * step * 1.5)
        assert not np.array_equal(got, want) or mode == "fp16"


def test_small_tables_stay_fp32_and_the_layer_given_is_left_as_it_is():
    layer = _layer("qr", {"collisions": 16})  # quotient 63 rows, remainder 16
    quantized, records = quantized_layer(layer, "int8", min_rows=20)
    assert [(r["table"], r["mode"]) for r in records] == [
        ("quotient", "int8"),
        ("remainder", "fp32"),
    ]
    assert quantized.tables["remainder"].values.dtype == tf.float32
    assert layer.quotient.dtype == tf.float32  # a new layer; the source keeps its tables
    same, records = quantized_layer(layer, "int8", min_rows=64)
    assert same is layer and {r["mode"] for r in records} == {"fp32"}


def test_collection_quantized_form_records_the_tables_and_shrinks_the_saved_model(tmp_path):
    tables = [
        {"name": "big", "num_rows": 2000, "dim": 32},
        {
            "name": "small",
            "num_rows": 50,
            "dim": 32,
            "method": "hashing",
            "options": {"buckets": 40},
        },
    ]
    coll = EmbeddingCollection(tables, name="embedding")
    ids = {"big": tf.constant([1, 5, 1999], tf.int64), "small": tf.constant([3, 4, 9], tf.int64)}
    want = coll(ids).vectors
    new, record = quantized_form(coll, "int8", min_rows=1000)
    assert new is not coll and new.field_names == coll.field_names
    assert isinstance(new.layers_by_field["big"], QuantizedEmbedding)
    assert new.layers_by_field["small"] is coll.layers_by_field["small"]
    big, small = record["tables"]
    assert big == {"field": "big", "table": "table", "rows": 2000, "dim": 32, "mode": "int8",
                   "bytes_fp32": 2000 * 32 * 4, "bytes": 2000 * (32 + 4)}  # fmt: skip
    assert small["mode"] == "fp32" and small["bytes"] == small["bytes_fp32"] == 40 * 32 * 4
    assert record["bytes"] == big["bytes"] + small["bytes"]
    got = new(ids).vectors
    np.testing.assert_allclose(got["big"], want["big"], atol=0.01)
    np.testing.assert_array_equal(got["small"], want["small"])
    # the SavedModel variables: the big table at 36 of 128 bytes a row (3.56x smaller), less
    # the checkpoint's own few KB
    sizes = {}
    for name, block in (
        ("fp32", coll.layers_by_field["big"]),
        ("int8", new.layers_by_field["big"]),
    ):
        tf.saved_model.save(layer_module(block), str(tmp_path / name))
        sizes[name] = saved_model_bytes(tmp_path / name)["variables"]
    assert sizes["fp32"] / sizes["int8"] >= 3.4


@pytest.mark.parametrize("mode", ["int8", "fp16"])
def test_quantized_table_config_and_saved_model_round_trip(mode, tmp_path):
    values = np.random.default_rng(3).normal(0, 1, (30, 6)).astype(np.float32)
    table = QuantizedTable.of(values, mode, name="t")
    config = table.get_config()
    again = QuantizedTable.from_config(config)
    assert again.get_config() == config and not again.built
    layer = quantized_layer(_layer("amtl", {}), mode, 0)[0]
    rebuilt = tf.keras.layers.deserialize(tf.keras.layers.serialize(layer))
    assert rebuilt.get_config() == layer.get_config()
    dense, ragged = _ids()
    assert_saved_model_round_trip(layer, dense, ragged, tmp_path)


def test_argument_errors_name_what_was_expected():
    layer = _layer("full", {})
    with pytest.raises(ValueError, match=r"mode must be one of \('int8', 'fp16'\), got 'int4'"):
        quantized_layer(layer, "int4", 0)
    with pytest.raises(ValueError, match="min_rows must be an integer >= 0, got -1"):
        quantized_layer(layer, "int8", -1)
    with pytest.raises(ValueError, match="mode must be one of"):
        QuantizedTable(4, 2, "int4")
    with pytest.raises(ValueError, match="total_values must be an integer in"):
        QuantizedTable(4, 2, "int8", total_values=9)
    with pytest.raises(ValueError, match="beyond float16"):
        quantize_rows(np.array([[1e6]]), "fp16")
    with pytest.raises(ValueError, match="quantized tables cover"):
        quantized_layer(tf.keras.layers.Dense(2, name="d"), "int8", 0)
    with pytest.raises(ValueError, match="must be an EmbeddingCollection"):
        quantized_form(layer, "int8", 0)


def test_a_quantized_lookup_runs_fused_as_the_server_fuses_an_export(tmp_path):
    """``export --fuse`` plans the serving signature at load: the int8 gathers and the
    dequantization are ops like the others (a cluster gives the plain signature's outputs)."""
    layer = quantized_layer(_layer("full", {}), "int8", 0)[0]

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
        def serve(self, ids):
            return {"score": tf.sigmoid(tf.reduce_sum(self.layer(ids), axis=1))}

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    loaded = tf.saved_model.load(str(tmp_path / "sm"))  # kept alive: the signature needs it
    sig = loaded.signatures["serving_default"]
    fused = FusedSignature(sig, FusionSpec(ladder=(16,), plan_batch=16), HAND)
    ids = np.arange(-2, 38, dtype=np.int64)
    assert fused.clusters >= 1
    fused.warmup({"ids": ids[:4]})
    want = sig(ids=tf.constant(ids))["score"].numpy()
    np.testing.assert_allclose(fused({"ids": ids})["score"].numpy(), want, rtol=1e-6)


def test_a_model_without_an_embedding_block_is_left_as_it_is():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)], name="linear")
    same, record = quantized_model(model, "int8", 0)
    assert same is model and record["tables"] == [] and record["bytes"] == 0
    with pytest.raises(ValueError, match="mode must be one of"):
        quantized_model(model, "int4", 0)
