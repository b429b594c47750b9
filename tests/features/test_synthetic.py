"""Tests of the synthetic Criteo-layout click log and its planted ground truth."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from features import synthetic_config, synthetic_model
from features.schema import FeatureKind, load_schema
from features.synthetic import click_probabilities, generate_batches, write_dataset
from features.synthetic_config import (
    DEFAULT_VOCAB_SIZES,
    SyntheticConfig,
    arrow_schema,
    synthetic_schema,
)
from features.synthetic_model import ground_truth

SMALL = SyntheticConfig(rows=20_000, seed=3)


def _table(config: SyntheticConfig, batch_rows: int = 262_144) -> pa.Table:
    return pa.Table.from_batches(list(generate_batches(config, batch_rows)))


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


def test_default_config_is_criteo_like() -> None:
    c = SyntheticConfig()
    assert (c.num_numeric, c.num_categorical) == (13, 26)
    assert c.vocab_sizes == DEFAULT_VOCAB_SIZES and len(c.vocab_sizes) == 26
    assert sum(10 <= v <= 100 for v in c.vocab_sizes) >= 4
    assert sum(1_000 <= v <= 100_000 for v in c.vocab_sizes) > 13
    assert sum(c.vocab_sizes) < 1_000_000
    assert SyntheticConfig(vocab_sizes=50, n_pairs=1, n_triples=1).vocab_sizes == (50,) * 26


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"rows": 0}, r"rows must be an integer >= 1, got 0"),
        ({"rows": -5}, r"rows .* got -5"),
        ({"rows": 10.5}, r"rows .* got 10.5"),
        ({"rows": True}, r"rows .* got True"),
        ({"seed": -1}, r"seed must be an integer >= 0, got -1"),
        ({"num_categorical": -1}, r"num_categorical .* got -1"),
        ({"n_pairs": -1}, r"n_pairs .* got -1"),
        ({"missing_rate": -0.1}, r"missing_rate must be a finite number in \[0.0, 1.0\), got -0.1"),
        ({"missing_rate": 1.0}, r"missing_rate .* got 1.0"),
        ({"zipf_exponent": 0.0}, r"zipf_exponent .* \(0.0, inf\), got 0.0"),
        ({"zipf_exponent": float("nan")}, r"zipf_exponent .* got nan"),
        ({"effect_scale": -1.0}, r"effect_scale .* got -1.0"),
        ({"target_ctr": 0.0}, r"target_ctr .* \(0.0, 1.0\), got 0.0"),
        ({"target_ctr": 1.5}, r"target_ctr .* got 1.5"),
        ({"vocab_sizes": (10, 20)}, r"vocab_sizes must have num_categorical=26 entries, got 2"),
        ({"vocab_sizes": "big"}, r"vocab_sizes must be an int or a sequence"),
        ({"vocab_sizes": 0}, r"vocab_sizes\[0\] \(field C1\) must be an integer in \[1, .*got 0"),
        ({"vocab_sizes": 1_000}, r"vocab_sizes: n_triples=2 needs 6 .* \[2, 100\], found 0"),
        (
            {"vocab_sizes": (5,) * 6 + (5_000,) * 20},
            r"vocab_sizes: n_pairs=3 with n_triples=2 needs 12 .* \[2, 1000\], found 6",
        ),
        (
            {"num_categorical": 12, "vocab_sizes": 10},
            r"vocab_sizes: n_single=4, n_pairs=3, n_triples=2 need 16 .* found 12",
        ),
        ({"vocab_sizes": 1}, r"vocab_sizes: n_triples=2 needs 6 .* found 0"),
        ({"n_numeric_effects": 14}, r"n_numeric_effects must be <= num_numeric=13, got 14"),
        ({"num_numeric": 0, "num_categorical": 0}, r"num_numeric \+ num_categorical must be"),
    ],
)
def test_config_validation_names_argument_value_and_expectation(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        SyntheticConfig(**kwargs)


def test_call_argument_validation(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"batch_rows must be an integer >= 1, got 0"):
        generate_batches(SMALL, batch_rows=0)
    with pytest.raises(ValueError, match=r"test_fraction must be a number in \[0, 1\), got 1.0"):
        write_dataset(SMALL, tmp_path, test_fraction=1.0)
    with pytest.raises(ValueError, match=r"rows_per_shard must be an integer >= 1, got 0"):
        write_dataset(SMALL, tmp_path, rows_per_shard=0)


def test_small_layouts_without_effects_work() -> None:
    config = SyntheticConfig(
        rows=1_000,
        num_numeric=2,
        num_categorical=3,
        vocab_sizes=(1, 7, 300),
        n_single=0,
        n_pairs=1,
        n_triples=0,
        n_numeric_effects=0,
    )
    table = _table(config)
    assert table.column_names == ["label", "I1", "I2", "C1", "C2", "C3"]
    assert pc.count_distinct(table.column("C1")).as_py() == 1
    truth = ground_truth(config)
    assert truth["pairs"][0]["fields"] == ["C2", "C3"] and truth["single"] == []
    assert truth["noise_fields"] == ["C1"] and truth["numeric"] == []
    with pytest.raises(ValueError, match=r"n_single=1, n_pairs=1, n_triples=0 need 3 .* found 2"):
        dataclasses.replace(config, n_single=1)


# ---------------------------------------------------------------------------------------------
# Batches, determinism, schema, ground truth
# ---------------------------------------------------------------------------------------------


def test_batches_have_the_arrow_types_and_sizes() -> None:
    config = dataclasses.replace(SMALL, rows=10_000)
    batches = list(generate_batches(config, batch_rows=3_000))
    assert [b.num_rows for b in batches] == [3_000, 3_000, 3_000, 1_000]
    expected = arrow_schema(config)
    assert all(b.schema == expected for b in batches)
    assert expected.field("label").type == pa.float32() and not expected.field("label").nullable
    assert expected.field("I1").type == pa.float32() and expected.field("C26").type == pa.string()
    table = pa.Table.from_batches(batches)
    assert set(pc.unique(table.column("label")).to_pylist()) == {0.0, 1.0}
    counts = pc.drop_null(table.column("I3")).to_numpy()
    assert (counts >= 0).all() and np.array_equal(counts, np.floor(counts))
    tokens = pc.drop_null(table.column("C7")).to_pylist()
    assert all(re.fullmatch(r"[0-9a-f]{8}", t) for t in tokens)


def test_same_config_gives_identical_rows_whatever_batch_rows() -> None:
    config = dataclasses.replace(SMALL, rows=150_000)  # more than two generation chunks
    reference = _table(config)
    for batch_rows in (7_777, synthetic_config.CHUNK_ROWS, 150_000):
        assert _table(config, batch_rows).equals(reference)
    probs = np.concatenate(list(click_probabilities(config, 10_000)))
    assert np.array_equal(probs, np.concatenate(list(click_probabilities(config))))
    assert len(probs) == config.rows


def test_rows_are_a_prefix_of_a_longer_run_and_seeds_differ() -> None:
    short, long = _table(SMALL), _table(dataclasses.replace(SMALL, rows=70_000))
    assert long.slice(0, SMALL.rows).equals(short)
    long_truth = ground_truth(dataclasses.replace(SMALL, rows=70_000))
    assert long_truth.pop("rows") == 70_000
    assert long_truth == {k: v for k, v in ground_truth(SMALL).items() if k != "rows"}
    other = _table(dataclasses.replace(SMALL, seed=4))
    assert not other.column("label").equals(short.column("label"))
    assert not set(pc.unique(other.column("C9")).to_pylist()) & set(
        pc.unique(short.column("C9")).to_pylist()
    ) - {None}
    assert ground_truth(dataclasses.replace(SMALL, seed=4)) != ground_truth(SMALL)


def test_tokens_are_unique_per_field_value_and_hide_the_rank() -> None:
    model = synthetic_model.click_model(SMALL)
    all_tokens = np.concatenate([t.to_numpy(zero_copy_only=False) for t in model.tokens])
    assert len(np.unique(all_tokens)) == len(all_tokens) == sum(SMALL.vocab_sizes)
    head = model.tokens[2].to_pylist()[:50]  # the 50 most frequent values of C3
    assert head != sorted(head) and head != sorted(head, reverse=True)


def test_schema_round_trips_and_has_the_criteo_layout(tmp_path) -> None:
    schema = synthetic_schema(SyntheticConfig())
    assert schema.names == ["label"] + [f"I{i}" for i in range(1, 14)] + [
        f"C{i}" for i in range(1, 27)
    ]
    assert schema.source.format == "parquet"
    assert (
        schema.field("I5").kind == FeatureKind.NUMERIC and schema.field("I5").transform == "log1p"
    )
    assert (
        schema.field("C9").kind == FeatureKind.CATEGORICAL and schema.field("C9").dtype == "string"
    )
    schema.save(tmp_path / "s.toml")
    assert load_schema(tmp_path / "s.toml") == schema


def test_ground_truth_is_json_and_unambiguous() -> None:
    config = SyntheticConfig(seed=11)
    truth = ground_truth(config)
    assert json.loads(json.dumps(truth)) == truth
    assert truth["seed"] == 11 and truth["target_ctr"] == 0.25 and truth["zipf_exponent"] == 1.1
    assert len(truth["single"]) == 4 and len(truth["numeric"]) == 2
    assert [p["order"] for p in truth["pairs"]] == [2, 2, 2]
    assert [t["order"] for t in truth["triples"]] == [3, 3]
    fields = [s["field"] for s in truth["single"]]
    fields += [f for e in truth["pairs"] + truth["triples"] for f in e["fields"]]
    assert len(fields) == len(set(fields)) == 16  # disjoint: no triple sub-pair is a pair
    assert sorted(set(config.categorical_names) - set(fields)) == sorted(truth["noise_fields"])
    vocab = truth["vocab_sizes"]
    assert all(vocab[f] <= 100 for t in truth["triples"] for f in t["fields"])
    assert all(vocab[f] <= 1_000 for p in truth["pairs"] for f in p["fields"])
    for entry in truth["single"] + truth["pairs"] + truth["triples"]:
        assert 0.75 * 0.5 <= entry["scale"] <= 1.25 * 0.5
    assert all(0.375 <= abs(n["weight"]) <= 0.625 for n in truth["numeric"])


def test_planted_crosses_are_pure_interactions() -> None:
    """Every effect table has p-weighted mean 0 along each axis and unit variance."""
    config = SyntheticConfig(seed=5)
    model = synthetic_model.click_model(config)
    probs = [
        synthetic_model.zipf_probabilities(v, config.zipf_exponent) for v in config.vocab_sizes
    ]
    for cross in (*model.singles, *model.pairs, *model.triples):
        table = cross.table[(slice(-1),) * len(cross.fields)]  # drop the missing-value padding
        ps = [probs[f] for f in cross.fields]
        for axis, p in enumerate(ps):
            assert np.abs(np.tensordot(table, p, axes=([axis], [0]))).max() < 1e-9
        var = table**2
        for p in reversed(ps):
            var = var @ p
        assert float(var) == pytest.approx(1.0)


def test_write_dataset_files_schema_ground_truth_and_tsv(tmp_path) -> None:
    config = SyntheticConfig(rows=40_000, seed=2)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "part-00099.parquet").write_bytes(b"stale")
    summary = write_dataset(config, tmp_path, rows_per_shard=12_000, criteo_tsv=True)
    rows = summary["rows"]
    assert rows["train"] + rows["test"] == config.rows
    assert abs(rows["test"] / config.rows - 0.2) < 0.01
    train_files = sorted(p.name for p in (tmp_path / "train").iterdir())
    assert train_files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.read_metadata(p).num_rows for p in summary["paths"]["train"]] == [
        12_000,
        12_000,
        rows["train"] - 24_000,
    ]
    train = pq.read_table(tmp_path / "train")
    test = pq.read_table(tmp_path / "test")
    assert train.schema == arrow_schema(config) and test.num_rows == rows["test"]
    assert summary["ctr"]["train"] == pytest.approx(pc.mean(train.column("label")).as_py())
    assert 0.7 < summary["oracle_auc"] < 0.95
    assert load_schema(tmp_path / "schema.toml") == synthetic_schema(config)
    saved = json.loads((tmp_path / "ground_truth.json").read_text())
    observed = saved.pop("observed")
    assert saved == ground_truth(config)
    assert observed["oracle_auc"] == summary["oracle_auc"] and observed["rows"] == rows
    # the Criteo TSV holds the same train rows: integer counts, hex tokens, empty = missing
    criteo = load_schema("criteo")
    tsv = pcsv.read_csv(
        tmp_path / "train.tsv",
        read_options=pcsv.ReadOptions(column_names=list(criteo.source.columns)),
        parse_options=pcsv.ParseOptions(delimiter="\t"),
        convert_options=pcsv.ConvertOptions(
            column_types={f"C{i}": pa.string() for i in range(1, 27)},
            strings_can_be_null=True,
        ),
    )
    assert tsv.num_rows == rows["train"]
    assert tsv.column("I4").type == pa.int64()
    assert tsv.column("label").cast(pa.float32()).equals(train.column("label"))
    assert tsv.column("I4").cast(pa.float32()).equals(train.column("I4"))
    assert tsv.column("C13").equals(train.column("C13"))
    first = (tmp_path / "train.tsv").read_text().split("\n", 1)[0].split("\t")
    assert len(first) == 40 and first[0] in ("0", "1")
    assert (tmp_path / "test.tsv").exists()


# ---------------------------------------------------------------------------------------------
# Statistics and learnability of the planted structure (200k rows, shared)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data() -> dict:
    config = SyntheticConfig(rows=200_000, seed=0)
    table = _table(config)
    codes = {}
    for name in config.categorical_names:
        encoded = pc.dictionary_encode(table.column(name)).combine_chunks()
        codes[name] = pc.fill_null(encoded.indices, -1).to_numpy().astype(np.int64) + 1
    return {
        "config": config,
        "table": table,
        "prob": np.concatenate(list(click_probabilities(config))),
        "truth": ground_truth(config),
        "codes": codes,  # 0 = missing
        "label": table.column("label").to_numpy(),
    }


def test_observed_ctr_and_missing_rate(data) -> None:
    assert abs(data["label"].mean() - 0.25) < 0.02
    assert abs(data["prob"].mean() - 0.25) < 0.01
    table = data["table"]
    for name in ("I1", "I13", "C3", "C9", "C26"):
        rate = table.column(name).null_count / table.num_rows
        assert abs(rate - 0.02) < 0.003, (name, rate)
    assert table.column("label").null_count == 0


def test_target_ctr_is_met_for_another_target() -> None:
    config = SyntheticConfig(rows=60_000, target_ctr=0.05, seed=9, missing_rate=0.1)
    label = _table(config).column("label").to_numpy()
    assert abs(label.mean() - 0.05) < 0.01


def test_value_frequencies_are_zipf_like(data) -> None:
    for name in ("C7", "C11"):  # vocabularies 10_000 and 5_000
        counts = np.sort(np.bincount(data["codes"][name])[1:])[::-1]
        assert counts[0] > 50 * np.median(counts)
        ranks = np.arange(1, 101)
        slope = np.polyfit(np.log(ranks), np.log(counts[:100]), 1)[0]
        assert slope == pytest.approx(-1.1, abs=0.15), (name, slope)


def _one_hot(columns: list[np.ndarray], train: np.ndarray, min_count: int = 5):
    """Sparse one-hot of integer columns; values seen < min_count times in train are dropped."""
    blocks = []
    for col in columns:
        _, inverse = np.unique(col, return_inverse=True)
        keep = np.bincount(inverse[train], minlength=inverse.max() + 1) >= min_count
        index = np.where(keep[inverse], (np.cumsum(keep) - 1)[inverse], -1)
        rows = np.nonzero(index >= 0)[0]
        blocks.append(
            sp.csr_matrix(
                (np.ones(len(rows)), (rows, index[rows])), shape=(len(col), int(keep.sum()))
            )
        )
    x = sp.hstack(blocks).tocsr()
    return x[train], x[~train]


def _lr_auc(data: dict, fields: list[str], crosses: list[list[str]]) -> float:
    """Test AUC of an L2 logistic regression on one-hot fields and one-hot field crosses."""
    codes, y = data["codes"], data["label"]
    columns = [codes[f] for f in fields]
    for fs in crosses:
        cross = np.zeros(len(y), dtype=np.int64)
        for f in fs:
            cross = cross * (codes[f].max() + 1) + codes[f]
        columns.append(cross)
    train = np.arange(len(y)) < int(0.8 * len(y))
    x_train, x_test = _one_hot(columns, train)
    model = LogisticRegression(C=0.1, max_iter=500).fit(x_train, y[train])
    return roc_auc_score(y[~train], model.predict_proba(x_test)[:, 1])


def test_planted_pair_is_learnable_and_a_decoy_pair_is_not(data) -> None:
    """Margins checked over seeds 0-12: planted pairs gain 0.004-0.034 AUC (seed 0: 0.014),
    decoys (fields of two different pairs; a sub-pair of a triple) gain <= 0.0001; planted
    triples gain 0.011-0.033 (seeds 0-2; seed 0: 0.020)."""
    truth = data["truth"]
    singles = [s["field"] for s in truth["single"]]
    pair = truth["pairs"][0]["fields"]
    decoy = [truth["pairs"][0]["fields"][0], truth["pairs"][1]["fields"][0]]
    triple_sub_pair = truth["triples"][0]["fields"][:2]
    base = _lr_auc(data, singles, [])
    with_pair = _lr_auc(data, singles, [pair])
    assert base > 0.6
    assert with_pair - base > 0.008
    assert _lr_auc(data, singles, [decoy]) - base < 0.002
    assert _lr_auc(data, singles, [triple_sub_pair]) - base < 0.002
    assert _lr_auc(data, singles, [truth["triples"][0]["fields"]]) - base > 0.008
    oracle = roc_auc_score(data["label"][160_000:], data["prob"][160_000:])
    assert oracle > with_pair + 0.05


def test_pair_fields_carry_no_main_effect(data) -> None:
    """A pure interaction: its fields alone barely predict clicks; a single-effect field does."""
    truth = data["truth"]
    pair_field = truth["pairs"][0]["fields"][0]
    assert _lr_auc(data, [pair_field], []) < 0.52
    assert _lr_auc(data, [truth["single"][1]["field"]], []) > 0.55
