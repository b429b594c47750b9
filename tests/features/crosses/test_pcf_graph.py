"""PCF-GNN's pair graph: counts checked against a plain-Python reference, the node cap, bad input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.crosses.pcf_build import build_graph
from features.crosses.pcf_graph import PairGraph, Relation, smoothed_ctr
from features.read_report import DataError
from features.schema import load_schema
from tests.testdata import TINY_SCHEMA, make_tiny_table

ROWS = {
    "user": ["a", "a", "b", "b", "b", "c", "", "a"],
    "item": [1, 2, 1, 1, 2, 3, 1, -1],
    "tags": ["x|y", "y", "", "x", "x|z", "z", "y", "x"],
    "price": [1.0] * 8,
    "age": [30.0] * 8,
    "label": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
}


@pytest.fixture()
def hand(tmp_path: Path) -> dict:
    (tmp_path / "schema.toml").write_text(TINY_SCHEMA)
    schema = load_schema(tmp_path / "schema.toml").as_parquet()
    t = pa.table({**ROWS, "item": pa.array(ROWS["item"], pa.int64())})
    pq.write_table(t.slice(0, 5), tmp_path / "p0.parquet")
    pq.write_table(t.slice(5), tmp_path / "p1.parquet")
    return {"schema": schema, "files": [tmp_path / "p0.parquet", tmp_path / "p1.parquet"]}


def _reference(pairs, min_count=1):
    """Plain-Python counts: {(a value, b value): [clicks, impressions]} per pair."""

    def values(field, i):
        v = ROWS[field][i]
        if field == "tags":
            return [x for x in v.split("|") if x]
        return [] if v in ("", -1) else [str(v)]

    counts = {f: Counter() for p in pairs for f in p}
    for f in counts:
        for i in range(8):
            counts[f].update(values(f, i))
    known = {f: {v for v, c in counts[f].items() if c >= min_count} for f in counts}
    out = []
    for a, b in pairs:
        edges: dict = {}
        for i in range(8):
            for x in values(a, i):
                for y in values(b, i):
                    key = (x if x in known[a] else "<OOV>", y if y in known[b] else "<OOV>")
                    e = edges.setdefault(key, [0.0, 0])
                    e[0] += ROWS["label"][i]
                    e[1] += 1
        out.append(edges)
    return out


def _edges(graph: PairGraph, r: int) -> dict:
    rel = graph.relations[r]
    a, b = rel.pair
    return {
        (graph.value_of(a, int(u)), graph.value_of(b, int(v))): [c, int(n)]
        for u, v, c, n in zip(rel.u, rel.v, rel.clicks, rel.impressions, strict=True)
    }


def test_counts_match_reference(hand: dict) -> None:
    pairs = [("user", "item"), ("user", "tags")]
    g = build_graph(hand["schema"], hand["files"], pairs, alpha=2.0, batch_rows=3)
    ref = _reference(pairs)
    assert _edges(g, 0) == ref[0]
    assert _edges(g, 1) == ref[1]
    assert g.rows == 8 and g.prior == pytest.approx(5 / 8)
    # nodes: most frequent first, ties by value; id 0 is the OOV node
    assert g.vocab["user"] == ["a", "b", "c"] and g.counts["user"] == [3, 3, 1]
    assert g.vocab["tags"] == ["x", "y", "z"] and g.counts["tags"] == [4, 3, 2]
    # missing sides add no edge: row 6 (user ""), row 7 (item -1), row 2 (tags "")
    assert g.report["edges_missing_side"] == {"user x item": 2, "user x tags": 2}
    # (b, 1): two rows, two clicks -> (2 + 2 * 5/8) / (2 + 2)
    r0 = g.relations[0]
    i = next(
        k
        for k, (u, v) in enumerate(zip(r0.u, r0.v, strict=True))
        if g.value_of("user", u) == "b" and g.value_of("item", v) == "1"
    )
    assert g.statistic(0)[i] == pytest.approx((2 + 2 * 5 / 8) / 4)
    assert g.offsets == {"user": 0, "item": 4, "tags": 8} and g.num_nodes == 12


def test_min_count_and_max_nodes_cap(hand: dict) -> None:
    pairs = [("user", "tags")]
    g = build_graph(hand["schema"], hand["files"], pairs, min_count=2)
    assert g.vocab["user"] == ["a", "b"] and g.report["values_to_oov"]["user"] == 1
    assert _edges(g, 0) == _reference(pairs, min_count=2)[0]
    assert ("<OOV>", "z") in _edges(g, 0)  # user c's row lands on the OOV node
    capped = build_graph(hand["schema"], hand["files"], pairs, max_nodes=1)
    assert capped.vocab == {"user": ["a"], "tags": ["x"]}
    assert capped.num_nodes == 4  # a huge field costs at most max_nodes + 1 nodes


def test_high_cardinality_field_is_capped(tmp_path: Path) -> None:
    (tmp_path / "schema.toml").write_text(TINY_SCHEMA)
    schema = load_schema(tmp_path / "schema.toml").as_parquet()
    t = make_tiny_table(3000)
    users = [f"id{i}" for i in range(3000)]  # every value once: a huge-cardinality field
    users[:100] = ["hot"] * 100
    t = t.set_column(0, "user", pa.array(users))
    pq.write_table(t, tmp_path / "t.parquet")
    g = build_graph(schema, [tmp_path / "t.parquet"], [("user", "item")], min_count=2)
    assert g.vocab["user"] == ["hot"]
    assert g.report["values_to_oov"]["user"] == 2900
    oov = g.relations[0].u == 0
    assert g.relations[0].impressions[oov].sum() == 2900


def test_min_impressions_drops_edges(hand: dict) -> None:
    g = build_graph(hand["schema"], hand["files"], [("user", "item")], min_impressions=2)
    assert _edges(g, 0) == {("b", "1"): [2.0, 2]}
    assert g.report["edges_below_min_impressions"] == {"user x item": 4}


def test_save_load_round_trip(hand: dict, tmp_path: Path) -> None:
    g = build_graph(hand["schema"], hand["files"], [("user", "item"), ("tags", "item")])
    back = PairGraph.load(g.save(tmp_path / "g"))
    assert back.vocab == g.vocab and back.pairs == g.pairs and back.multi == {"tags": "|"}
    for r in range(2):
        assert _edges(back, r) == _edges(g, r)
    np.testing.assert_array_equal(back.statistic(1), g.statistic(1))
    with pytest.raises(FileNotFoundError, match="not a PCF-GNN pair graph"):
        PairGraph.load(tmp_path)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: (d / "graph.json").write_text("{"), "graph.json' is not valid JSON"),
        (lambda d: (d / "graph.json").write_text('{"fields": ["user"]}'), "(KeyError: 'pairs')"),
        (lambda d: (d / "edges" / "0.parquet").write_bytes(b"x"), "cannot be read (ArrowInvalid"),
        (lambda d: (d / "vocab" / "0.parquet").unlink(), "cannot be read (FileNotFoundError"),
    ],
)
def test_a_damaged_graph_is_one_error_naming_it(hand: dict, tmp_path: Path, edit, expected):
    d = build_graph(hand["schema"], hand["files"], [("user", "item")]).save(tmp_path / "g")
    edit(d)
    with pytest.raises(DataError) as err:
        PairGraph.load(d)
    assert str(d) in str(err.value) and expected in str(err.value), err.value
    assert "the pair graph `stitchrec crosses pcf-gnn` writes" in str(err.value)


def _graph(clicks, impressions, alpha=1.0):
    rel = Relation(
        ("u", "v"),
        np.array([1, 2], np.int32),
        np.array([1, 1], np.int32),
        np.array(clicks, np.float64),
        np.array(impressions, np.int64),
    )
    return PairGraph(["u", "v"], {"u": ["a", "b"], "v": ["x"]}, {"u": [2, 1], "v": [3]},
                     [rel], prior=0.5, alpha=alpha)  # fmt: skip


def test_bad_edges_never_reach_training() -> None:
    _graph([1.0, 0.0], [2, 1])  # fine
    with pytest.raises(
        DataError, match=r"pair \('b', 'x'\): impressions .* expected impressions >= 1"
    ):
        _graph([1.0, 0.0], [2, 0])
    with pytest.raises(DataError, match="expected a finite click count"):
        _graph([np.nan, 0.0], [2, 1])
    with pytest.raises(DataError, match="expected clicks <= impressions"):
        _graph([3.0, 0.0], [2, 1])
    with pytest.raises(DataError, match="expected clicks >= 0"):
        _graph([-1.0, 0.0], [2, 1])
    # no smoothing and no impressions would be 0/0 = NaN: refused (as zero impressions)
    with pytest.raises(DataError, match="impressions"):
        _graph([0.0, 0.0], [0, 1], alpha=0.0)
    g = _graph([1.0, 0.0], [2, 1])
    g.relations[0].impressions[1] = 0  # corrupted after construction: validate() refuses it
    with pytest.raises(DataError, match="impressions >= 1"):
        g.validate()
    assert np.isnan(smoothed_ctr(np.array([0.0]), np.array([0]), 0.5, 0.0))[0]


def test_bad_labels_and_arguments(hand: dict, tmp_path: Path) -> None:
    t = pq.read_table(hand["files"][0])
    t = t.set_column(t.schema.get_field_index("label"), "label", pa.array([1.0, 2.0, 0, 0, 0]))
    pq.write_table(t, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet: row 2, column 'label': value 2.0"):
        build_graph(hand["schema"], [tmp_path / "bad.parquet"], [("user", "item")])
    s, f = hand["schema"], hand["files"]
    with pytest.raises(ValueError, match="'price' is numeric"):
        build_graph(s, f, [("user", "price")])
    with pytest.raises(ValueError, match="two different fields"):
        build_graph(s, f, [("user", "user")])
    with pytest.raises(ValueError, match="given twice"):
        build_graph(s, f, [("user", "item"), ("item", "user")])
    with pytest.raises(ValueError, match="at least one field pair"):
        build_graph(s, f, [])
    with pytest.raises(ValueError, match="min_count must be an integer >= 1"):
        build_graph(s, f, [("user", "item")], min_count=0)
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        build_graph(s, f, [("user", "item")], alpha=float("nan"))
    with pytest.raises(KeyError, match="no field 'nope'"):
        build_graph(s, f, [("user", "nope")])
