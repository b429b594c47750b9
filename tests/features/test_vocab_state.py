import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.preprocessing import build_preprocessor, plan_fields
from features.read_report import DataError
from features.schema import FeatureSpec, Schema, SchemaError, SourceSpec
from features.stats import compute_stats
from features.vocab_state import FieldChange, VocabOptions, VocabState, vocab_fields


def _schema(**item):
    fields = [
        FeatureSpec("item", "categorical", **item),
        FeatureSpec("tags", "multi_categorical"),
        FeatureSpec("hist", "sequence", max_len=3, shares_embedding_with="item"),
        FeatureSpec("h", "categorical", vocab="hash", hash_buckets=8),
        FeatureSpec("x", "numeric"),
        FeatureSpec("label", "label"),
    ]
    return Schema("s", tuple(fields), SourceSpec(format="parquet"))


def _window(schema, items, all_counts=True):
    """A window whose `item` column holds `items` (one value a row)."""
    n = len(items)
    batch = pa.record_batch(
        {
            "item": pa.array(items, pa.string()),
            "tags": pa.array(["t|u"] * n),
            "hist": pa.array(["a|b"] * n),
            "h": pa.array(["q"] * n),
            "x": pa.array(np.arange(n, dtype=np.float32)),
            "label": pa.array(np.zeros(n, np.float32)),
        }
    )
    return compute_stats(schema, [batch], all_counts=all_counts)


def _rows(state, name="item"):
    """{value: (count, last_seen, id)} of the state's table."""
    t = state.tables[name].to_pydict()
    columns = zip(t["value"], t["count"], t["last_seen"], t["id"], strict=True)
    return {v: (c, s, i) for v, c, s, i in columns}


def _run(schema, options, windows):
    state = VocabState.first(_window(schema, windows[0]), schema, options)
    changes = []
    for items in windows[1:]:
        state, change = state.advance(_window(schema, items), schema, options)
        changes.append(change["item"])
    return state, changes


def test_all_counts_keep_every_value_and_change_nothing_else():
    schema = _schema(min_count=2)
    items = ["a", "a", "b", "c", "c", "c"]
    plain, full = _window(schema, items, all_counts=False), _window(schema, items)
    assert plain["item"].all_counts is None
    assert full["item"].all_counts.to_pydict() == {"value": ["c", "a", "b"], "count": [3, 2, 1]}
    assert full["item"].vocab == plain["item"].vocab == ["c", "a"]
    assert full["hist"].all_counts is None and full["h"].all_counts is None  # shared, hashed
    for name in plain.fields:
        assert full[name].summary() == plain[name].summary()
    assert [s.name for s in vocab_fields(schema)] == ["item", "tags"]


def test_decay_over_three_windows():
    options = VocabOptions(decay=0.5)
    state, changes = _run(_schema(), options, [list("aaaabbc"), list("aad"), list("bbb")])
    # w0: a4 b2 c1 (ids 1, 2, 3). w1: a 2+2=4, b 1, c 0.5 (< min_count 1: out), d 1 (id 3).
    # w2: a 2, b 0.5+3=3.5, c 0.25, d 0.5 (out).
    assert changes[0] == FieldChange(kept=2, added=1, evicted=1, moved=0, size=3)
    assert changes[1] == FieldChange(kept=2, added=0, evicted=1, moved=0, size=2)
    assert _rows(state) == {
        "a": (2.0, 1, 1),
        "b": (3.5, 2, 2),
        "d": (0.5, 1, 0),
        "c": (0.25, 0, 0),
    }
    assert list(_rows(state)) == ["a", "b", "d", "c"]  # vocabulary by id, then by count
    assert state.window == 2 and state.vocab("item") == ["a", "b"] and state.size("item") == 2


def test_admission_by_decayed_min_count():
    options = VocabOptions(decay=0.5)
    state, changes = _run(_schema(min_count=3), options, [list("aaaabb"), list("bba"), list("ccc")])
    # w0: a4 (id 1), b2 (not admitted). w1: a 2+1=3, b 1+2=3: b admitted as id 2.
    # w2: a 1.5, b 1.5 both out; c 3 takes the lowest freed id.
    assert changes[0] == FieldChange(kept=1, added=1, evicted=0, moved=0, size=2)
    assert changes[1] == FieldChange(kept=0, added=1, evicted=2, moved=0, size=1)
    assert _rows(state) == {"c": (3.0, 2, 1), "a": (1.5, 1, 0), "b": (1.5, 1, 0)}


def test_eviction_after_unseen_windows_compacts_ids():
    options = VocabOptions(evict_after=1)
    state, changes = _run(_schema(), options, [list("abc"), list("ac"), list("a")])
    # w1: b unseen 1 window: kept. w2: b unseen 2 > 1: evicted and forgotten; c (id 3) moves
    # down into the hole 2 so the ids stay 1..2.
    assert changes[0] == FieldChange(kept=3, added=0, evicted=0, moved=0, size=3)
    assert changes[1] == FieldChange(kept=2, added=0, evicted=1, moved=1, size=2)
    assert _rows(state) == {"a": (3.0, 2, 1), "c": (2.0, 1, 2)}


def test_cap_evicts_the_coldest_then_oldest_then_lowest_value():
    state, changes = _run(_schema(max_vocab=2), VocabOptions(), [list("aabbc"), list("ccd"), ["d"]])
    # w0: a2 b2 (ids 1, 2), c1 over the cap. w1: c 3, a 2, b 2 (tie at last_seen 0: the lower
    # value a goes), d 1: c takes a's id 1. w2: c 3 (seen w1), d 2 (seen w2), b 2 (seen w0): b
    # goes, d takes its id 2.
    assert changes[0] == FieldChange(kept=1, added=1, evicted=1, moved=0, size=2)
    assert changes[1] == FieldChange(kept=1, added=1, evicted=1, moved=0, size=2)
    assert _rows(state) == {
        "c": (3.0, 1, 1),
        "d": (2.0, 2, 2),
        "a": (2.0, 0, 0),
        "b": (2.0, 0, 0),
    }


def test_stable_ids_fill_holes_lowest_first_append_then_move_highest_down():
    options = VocabOptions(decay=0.5)
    windows = [list("abcd"), list("bdeefffg"), list("gg")]
    first = VocabState.first(_window(_schema(), windows[0]), _schema(), options)
    assert first.vocab("item") == ["a", "b", "c", "d"]
    state, changes = _run(_schema(), options, windows[:2])
    # w1: a, c decay to 0.5 (out): ids 1, 3 freed. b, d (1.5) keep ids 2, 4. New by count:
    # f 3 -> 1, e 2 -> 3, g 1 -> 5 (appended).
    assert changes[0] == FieldChange(kept=2, added=3, evicted=2, moved=0, size=5)
    assert state.vocab("item") == ["f", "b", "e", "d", "g"]
    state, change = state.advance(_window(_schema(), windows[2]), _schema(), options)
    # w2: b, d 0.75 (out): ids 2, 4 free; size 3, so g (id 5) moves down into 2.
    assert change["item"] == FieldChange(kept=3, added=0, evicted=2, moved=1, size=3)
    assert state.vocab("item") == ["f", "g", "e"]
    assert change.to_dict()["fields"]["item"]["moved"] == 1 and change.window == 2


def test_shared_sequences_and_hashed_fields_have_no_state():
    schema = _schema()
    state = VocabState.first(_window(schema, list("ab")), schema, VocabOptions())
    assert state.fields == ["item", "tags"]
    assert state.vocab("tags") == ["t", "u"]


def test_stats_give_each_value_its_state_id():
    schema, options = _schema(), VocabOptions(decay=0.5)
    windows = [list("abcd"), list("bdeefffg")]
    state, _ = _run(schema, options, windows)
    window = _window(schema, windows[1])
    stats = state.stats(window)
    item = stats["item"]
    assert item.vocab == ["f", "b", "e", "d", "g"]
    assert item.vocab_counts == [3, 2, 2, 2, 1]  # 3, 1.5, 2, 1.5, 1 rounded half up
    assert item.oov_count == 0 and item.count == 8
    assert window["item"].vocab == ["f", "e", "b", "d", "g"]  # the window's own order differs
    assert stats["x"] is not window["x"] and stats["x"].summary() == window["x"].summary()
    plans = {p["name"]: p for p in plan_fields(schema, stats)}
    assert plans["item"]["vocabulary"] == item.vocab and plans["item"]["num_rows"] == 6
    assert plans["hist"]["table"] == "item" and plans["h"]["op"] == "hash"
    ids, _ = build_preprocessor(schema, stats)(
        {
            "item": tf.constant(["f", "b", "e", "d", "g", "a"]),
            "tags": tf.constant(["t"] * 6),
            "hist": tf.constant(["g|f"] * 6),
            "h": tf.constant(["q"] * 6),
            "x": tf.zeros([6]),
        }
    )
    assert ids["item"].numpy().tolist() == [1, 2, 3, 4, 5, 0]
    assert ids["hist"].to_list()[0] == [5, 1]


def test_stats_oov_count_from_the_window():
    schema = _schema(min_count=2)
    state = VocabState.first(_window(schema, list("aab")), schema, VocabOptions())
    stats = state.stats(_window(schema, list("aabbbc")))  # b, c outside the state's vocabulary
    assert stats["item"].vocab == ["a"] and stats["item"].oov_count == 4


def test_save_load_round_trip(tmp_path):
    schema, options = _schema(), VocabOptions(decay=0.5, evict_after=3)
    state, _ = _run(schema, options, [list("abcd"), list("bdeefffg")])
    assert not VocabState.exists(tmp_path)
    state.save(tmp_path)
    assert VocabState.exists(tmp_path)
    raw = json.loads((tmp_path / "vocab_state" / "state.json").read_text())
    assert raw == {
        "window": 1,
        "options": {"decay": 0.5, "evict_after": 3},
        "fields": {"item": "item.parquet", "tags": "tags.parquet"},
    }
    back = VocabState.load(tmp_path)
    assert back.window == 1 and back.options == options and back.fields == state.fields
    for name in state.fields:
        assert back.tables[name].equals(state.tables[name])
    state.save(tmp_path)  # over the earlier state
    assert sorted(p.name for p in (tmp_path / "vocab_state").iterdir()) == [
        "item.parquet",
        "state.json",
        "tags.parquet",
    ]
    assert VocabState.load(tmp_path).tables["item"].equals(state.tables["item"])
    with pytest.raises(FileNotFoundError, match=r"state\.json"):
        VocabState.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: (d / "state.json").write_text('{"window": 1'), "is not valid JSON"),
        (lambda d: (d / "state.json").write_text("[1]"), "holds a JSON array, not an object"),
        (lambda d: (d / "state.json").write_text('{"window": 1}'), "has no fields object"),
        (
            lambda d: (d / "state.json").write_text(
                '{"window": 1, "options": {"decay": 7}, "fields": {}}'
            ),
            "options: VocabOptions decay = 7: expected a number in (0, 1]",
        ),
        (lambda d: (d / "item.parquet").write_bytes(b"x"), "(field 'item') cannot be read"),
        (
            lambda d: pq.write_table(pa.table({"value": ["a"]}), d / "item.parquet"),
            "item.parquet': columns value string; expected value string, count double",
        ),
    ],
)
def test_load_names_the_file_and_what_is_wrong(tmp_path, edit, expected):
    state, _ = _run(_schema(), VocabOptions(), [list("abcd")])
    edit(state.save(tmp_path))
    with pytest.raises(DataError) as err:
        VocabState.load(tmp_path)
    assert str(tmp_path / "vocab_state") in str(err.value) and expected in str(err.value)


def test_tables_must_hold_dense_ids_first():
    t = pa.table(
        {
            "value": pa.array(["a", "b"]),
            "count": pa.array([2.0, 1.0]),
            "last_seen": pa.array([0, 0]),
            "id": pa.array([2, 0]),
        }
    )
    with pytest.raises(ValueError, match=r"'item'.*first 1 rows must hold ids 1..1"):
        VocabState({"item": t}, 0, VocabOptions())
    with pytest.raises(ValueError, match=r"columns value string, count double.*expected"):
        VocabState({"item": t.drop_columns(["id"])}, 0, VocabOptions())


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"decay": 0.0}, r"decay = 0.0: expected a number in \(0, 1\]"),
        ({"decay": 1.5}, r"decay = 1.5: expected a number in \(0, 1\]"),
        ({"decay": True}, r"decay = True: expected a number"),
        ({"evict_after": -1}, r"evict_after = -1: expected an integer >= 0"),
        ({"evict_after": 1.5}, r"evict_after = 1.5: expected an integer >= 0"),
    ],
)
def test_bad_options(kwargs, text):
    with pytest.raises(ValueError, match=text):
        VocabOptions(**kwargs)


def test_advance_needs_full_counts_and_the_same_fields():
    schema, options = _schema(), VocabOptions()
    state = VocabState.first(_window(schema, list("ab")), schema, options)
    with pytest.raises(ValueError, match=r"'item' lack every value's count.*all_counts=True"):
        state.advance(_window(schema, list("ab"), all_counts=False), schema, options)
    other = _schema(vocab="hash", hash_buckets=4)
    with pytest.raises(SchemaError, match=r"has fields \['item', 'tags'\].*\['tags'\]"):
        state.advance(_window(other, list("ab")), other, options)
