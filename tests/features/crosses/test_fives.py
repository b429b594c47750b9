"""FIVES: the adjacency and propagation math against NumPy, the network's config and SavedModel
round-trips, cross read-out, bad input, and a search that finds a planted pure pair."""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from features.crosses import (
    fives_config,
    fives_encoding,
    fives_graph,
    fives_network,
    fives_readout,
    fives_search,
)
from features.crosses.artifact import load_crosses
from features.schema import schema_from_dict
from ranking.metrics import auc

SCHEMA = """
name = "xor"
[source]
format = "parquet"
[[fields]]
names = "c{1..4}"
kind = "categorical"
[[fields]]
name = "n1"
kind = "numeric"
[[fields]]
name = "label"
kind = "label"
"""


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _ref_adjacency(h, tau):
    """Eq. 7-8 in NumPy."""
    f = h.shape[1]
    off = 1 - np.eye(f)
    out = [_sigmoid(h[0] / tau) * off]
    for k in range(1, h.shape[0]):
        prev = (out[-1] >= 0.5).astype(float)
        deg = prev.sum(1, keepdims=True)
        mean = prev @ _sigmoid(h[k]) / np.maximum(deg, 1)
        mean = np.clip(mean, 1e-6, 1 - 1e-6)
        out.append(_sigmoid(np.log(mean / (1 - mean)) / tau) * off * (deg > 0))
    return out


def test_adjacency_matches_numpy_and_binarizes_straight_through():
    rng = np.random.default_rng(0)
    h = rng.normal(0, 2, (2, 5, 5)).astype(np.float32)
    for tau in (1.0, 0.1):
        got = [a.numpy() for a in fives_graph.adjacency(tf.constant(h), tau)]
        for g, r in zip(got, _ref_adjacency(h.astype(np.float64), tau), strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    # binarization at 0.5 is the same at every temperature (a >= 0.5 iff logit >= 0)
    hard = [(a >= 0.5) for a in _ref_adjacency(h.astype(np.float64), 1.0)]
    cold = [(a >= 0.5) for a in _ref_adjacency(h.astype(np.float64), 0.02)]
    for a, b in zip(hard, cold, strict=True):
        np.testing.assert_array_equal(a, b)
    x = tf.constant([0.2, 0.7])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fives_graph.binarize(x)
    np.testing.assert_array_equal(y.numpy(), [0.0, 1.0])
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [1.0, 1.0])


def test_propagate_matches_numpy():
    rng = np.random.default_rng(1)
    b, f, d = 3, 4, 2
    e = rng.normal(size=(b, f, d)).astype(np.float32)
    w = rng.normal(size=(2, f, d, d)).astype(np.float32)
    adj = [rng.uniform(0, 1, (f, f)).astype(np.float32) for _ in range(2)]
    got = [
        s.numpy() for s in fives_graph.propagate(tf.constant(e), [tf.constant(a) for a in adj], w)
    ]
    state = e
    np.testing.assert_allclose(got[0], e)
    for k, a in enumerate(adj):
        we = np.einsum("bfd,fde->bfe", e, w[k])
        active = np.maximum((a >= 0.5).sum(1), 1)
        p = np.einsum("ij,bjd->bid", a, we) / active[None, :, None]
        state = p * state
        np.testing.assert_allclose(got[k + 1], state, rtol=1e-5, atol=1e-6)


def test_extract_crosses_reads_paths_off_the_adjacency():
    names = ["a", "b", "c", "d"]
    a1 = np.full((4, 4), 0.1)
    a1[0, 1] = 0.9  # a -> b at layer 1: the pair {a, b}
    a2 = np.full((4, 4), 0.1)
    a2[0, 2] = 0.8  # root a, then c at layer 2: the triple {a, b, c}
    ranked = fives_readout.extract_crosses([a1, a2], names)
    assert ranked[0] == (("a", "b"), 0.9, True)
    assert ranked[1][0] == ("a", "b", "c")
    assert ranked[1][1] == pytest.approx(0.72) and ranked[1][2]
    # every pair and triple is ranked once, by its best path
    assert len({frozenset(c) for c, _, _ in ranked}) == len(ranked) == 6 + 4
    assert all(s <= 0.1 + 1e-9 for c, s, _ in ranked[2:] if len(c) == 2)


def test_network_config_and_saved_model_round_trip(tmp_path):
    net = fives_network.FivesNetwork([5, 4, 3], embedding_dim=3, max_order=3, mlp=[8], name="fives")
    ids = tf.constant([[0, 1, 2], [4, 3, 2], [1, 0, 0]], tf.int32)
    before = net(ids).numpy()
    again = fives_network.FivesNetwork.from_config(net.get_config())
    again(ids)
    again.set_weights(net.get_weights())
    np.testing.assert_allclose(again(ids).numpy(), before, rtol=1e-6)

    class Module(tf.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32)])
        def f(self, x):
            return self.layer(x)

    tf.saved_model.save(Module(net), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.f(ids).numpy(), before, rtol=1e-6)
    assert [v.name for v in net.arch_variables] == [net.h.name]
    assert all(v is not net.h for v in net.weight_variables)
    with pytest.raises(ValueError, match="two or more fields"):
        fives_network.FivesNetwork([5])
    with pytest.raises(ValueError, match="max_order"):
        fives_network.FivesNetwork([5, 5], max_order=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_order": 1}, "max_order"),
        ({"epochs": 2, "warmup_epochs": 2}, "warmup_epochs"),
        ({"tau_start": 0.1, "tau_end": 0.5}, "tau_end"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"mlp": (0,)}, "mlp"),
        ({"screen_orders": (1,)}, "screen_orders"),
        ({"screen_orders": "3"}, "screen_orders"),
        ({"screen_alpha": 0.0}, "screen_alpha"),
        ({"screen_max_cells": 2}, "screen_max_cells"),
        ({"screen_max_sets": 0}, "screen_max_sets"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fives_config.FivesConfig(**kwargs)


def xor_table(rows: int, seed: int = 0) -> pa.Table:
    """label ~ Bernoulli(sigmoid(2.5 * s)) with s = +-1 from the parity of (c1, c2): a pure
    pair (no main effect of c1 or c2); c3, c4 and n1 are noise."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 4, (rows, 4))
    s = np.where((c[:, 0] + c[:, 1]) % 2 == 0, 1.0, -1.0)
    y = (rng.random(rows) < _sigmoid(2.5 * s)).astype(np.float32)
    cols = {f"c{i + 1}": pa.array([f"v{v}" for v in c[:, i]]) for i in range(4)}
    cols["n1"] = pa.array(rng.exponential(3.0, rows).astype(np.float32))
    cols["label"] = pa.array(y)
    return pa.table(cols)


def test_search_ranks_the_planted_pure_pair_first():
    schema = schema_from_dict(tomllib.loads(SCHEMA))
    lines = []
    cfg = fives_config.FivesConfig(epochs=6, batch_size=256, max_order=2, seed=0, screen_orders=())
    result = fives_search.search(schema, xor_table(6000), cfg, log=lines.append)
    assert result.crosses[0].fields == ("c1", "c2")
    assert result.crosses[0].active and result.crosses[0].distinct == 16
    assert sum(c.active for c in result.crosses) <= 3
    assert len(lines) == 1 + cfg.epochs and "epoch 6/6" in lines[-1]
    art = result.artifact("xor")
    assert art.boundaries["n1"] and art.crosses[0].name == "c1_x_c2"
    p = result.predict(result.encoder.transform(xor_table(2000, seed=1)))
    y = xor_table(2000, seed=1).column("label").to_numpy()
    assert auc(y, p) > 0.75  # the pair explains the label: ~0.81 is the ceiling


def test_useless_fields_are_skipped_and_reported():
    schema = schema_from_dict(tomllib.loads(SCHEMA))
    t = xor_table(400)
    t = t.set_column(2, "c3", pa.array(["same"] * 400))
    t = t.set_column(3, "c4", pa.array([None] * 400, pa.string()))
    enc = fives_encoding.fit_encoder(schema, t)
    assert enc.fields == ["c1", "c2", "n1"]
    assert enc.skipped == [
        {"field": "c3", "reason": "a single value"},
        {"field": "c4", "reason": "all values missing"},
    ]
    t = t.set_column(4, "n1", pa.array([np.nan] * 400, pa.float32()))
    lines = []
    with pytest.raises(fives_config.FivesDataError, match="1 usable field"):
        fives_search.search(
            schema,
            t.drop_columns(["c2"]).append_column("c2", pa.array([""] * 400)),
            fives_config.FivesConfig(epochs=1, warmup_epochs=0),
            log=lines.append,
        )
    assert any("skipping field 'n1': all values missing" in m for m in lines)


def test_a_split_without_positives_is_an_error():
    schema = schema_from_dict(tomllib.loads(SCHEMA))
    t = xor_table(300)
    y = np.zeros(300, np.float32)
    train, _ = fives_search.split_rows(300, 0.2, 0)
    y[train[:5]] = 1.0  # positives only in the training split
    t = t.set_column(t.column_names.index("label"), "label", pa.array(y))
    with pytest.raises(fives_config.FivesDataError, match=r"validation split .* has no positive"):
        fives_search.search(schema, t, fives_config.FivesConfig(epochs=1, warmup_epochs=0))
    with pytest.raises(fives_config.FivesDataError, match=r"training split .* has no negative"):
        t1 = t.set_column(t.column_names.index("label"), "label", pa.array(np.ones(300, "f4")))
        fives_search.search(schema, t1, fives_config.FivesConfig(epochs=1, warmup_epochs=0))
    with pytest.raises(ValueError, match="only categorical, multi_categorical and numeric"):
        fives_encoding.fit_encoder(schema, t, ["label"])


def _ref_contributions(net, ids):
    """Every product term of a linear-readout network by plain loops over fields, on centered
    embeddings, summed per field set; std over rows, divided by the largest."""
    table = net.table.numpy()
    offsets = net.offsets.numpy()
    w = net.w.numpy()
    f, d = net.num_fields, net.embedding_dim
    kernel = net.out.kernel.numpy()[:, 0].reshape(net.max_order, f, d)
    adj = [a for a in net.adjacency_at(float(net.tau.numpy()))]
    norm = [a / np.maximum((a >= 0.5).sum(1), 1)[:, None] for a in adj]
    e = table[ids + offsets]
    e = e - e.mean(0)
    terms: dict[frozenset, np.ndarray] = {}

    def add(key, value):
        terms[key] = terms.get(key, 0.0) + value

    for i in range(f):
        for k in range(f):
            if i == k:
                continue
            we1 = e[:, k] @ w[0, k]
            add(frozenset((i, k)), norm[0][i, k] * (kernel[1, i] * e[:, i] * we1).sum(1))
            for j in range(f):
                if j == i:
                    continue
                we2 = e[:, j] @ w[1, j]
                t = norm[0][i, k] * norm[1][i, j] * (kernel[2, i] * e[:, i] * we1 * we2).sum(1)
                add(frozenset((i, k, j)), t)
    std = {key: float(np.std(v)) for key, v in terms.items()}
    top = max(std.values())
    return {key: s / top for key, s in std.items()}


def test_contributions_match_plain_loops_over_the_product_terms():
    tf.keras.utils.set_random_seed(3)
    net = fives_network.FivesNetwork(
        [3, 4, 2, 5], embedding_dim=2, max_order=3, mlp=[], name="fives"
    )
    ids = np.stack([np.random.default_rng(0).integers(0, v, 40) for v in [3, 4, 2, 5]], 1)
    net(ids[:2])
    net.h.assign(np.random.default_rng(1).normal(0, 2, net.h.shape))
    net.w.assign(np.random.default_rng(2).normal(0, 1, net.w.shape))
    net.out.kernel.assign(np.random.default_rng(4).normal(0, 1, net.out.kernel.shape))
    names = ["a", "b", "c", "d"]
    got = fives_readout.contributions(net, ids.astype(np.int32), names, chunk=16)
    ref = _ref_contributions(net, ids)
    assert len(got) == 6 + 4
    for fields, strength, _ in got:
        key = frozenset(names.index(n) for n in fields)
        assert strength == pytest.approx(ref.get(key, 0.0), rel=1e-4, abs=1e-6)
    assert got[0][1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="linear readout"):
        fives_readout.contributions(
            fives_network.FivesNetwork([3, 3], mlp=[4]), ids[:, :2], names[:2]
        )


def test_adjacency_without_heredity_is_one_sigmoid_per_layer():
    h = np.random.default_rng(5).normal(0, 2, (2, 4, 4)).astype(np.float32)
    got = fives_graph.adjacency(tf.constant(h), 0.5, heredity=False)
    off = 1 - np.eye(4)
    for k in range(2):
        np.testing.assert_allclose(got[k].numpy(), _sigmoid(h[k] / 0.5) * off, rtol=1e-5)


def triple_table(rows: int = 8000) -> tuple[Any, pa.Table]:
    """label from the parity of (c1, c2, c3): a pure triple (no main or pair effect)."""
    rng = np.random.default_rng(0)
    c = rng.integers(0, 4, (rows, 5))
    s = np.where((c[:, 0] + c[:, 1] + c[:, 2]) % 2 == 0, 1.0, -1.0)
    y = (rng.random(rows) < _sigmoid(2.5 * s)).astype(np.float32)
    cols = {f"c{i + 1}": pa.array([f"v{v}" for v in c[:, i]]) for i in range(5)}
    cols["label"] = pa.array(y)
    schema = schema_from_dict(
        tomllib.loads(SCHEMA.replace("c{1..4}", "c{1..5}").replace('name = "n1"', 'name = "n0"'))
    )
    return schema, pa.table(cols).append_column("n0", pa.array(np.zeros(rows, np.float32)))


def test_contribution_search_ranks_a_pure_triple_first():
    schema, table = triple_table()
    cfg = fives_config.FivesConfig(
        **fives_config.TRIPLE_SEARCH, epochs=4, warmup_epochs=2, batch_size=256, screen_orders=()
    )
    result = fives_search.search(schema, table, cfg, log=lambda _: None)
    assert result.crosses[0].fields == ("c1", "c2", "c3")
    assert result.crosses[0].strength == 1.0 and result.crosses[0].source == "fives"
    assert all(c.strength < 0.5 for c in result.crosses[1:])


def test_the_screen_adds_the_pure_triple_the_default_search_cannot_see(tmp_path):
    schema, table = triple_table()
    lines: list[str] = []
    cfg = fives_config.FivesConfig(epochs=2, batch_size=512)
    result = fives_search.search(schema, table, cfg, log=lines.append)
    top = result.crosses[0]
    assert top.fields == ("c1", "c2", "c3") and top.active and "screen" in top.source
    # +-0.42 around the mean click rate (sigmoid(2.5) - 1/2): most of var(y) = 0.25
    assert 0.6 < top.effect < 0.8
    selected = [c for c in result.crosses if c.active]
    assert all(c.effect is not None for c in selected)
    assert [c.effect for c in selected] == sorted((c.effect for c in selected), reverse=True)
    assert all(c.effect is None and not c.active for c in result.crosses[len(selected) :])
    assert any("order 3: 1 of 10 significant" in m for m in lines), lines
    report = result.screen
    assert report["orders"]["3"]["significant"] == 1 and report["selected"] == len(selected)
    path = result.artifact("triple").save(tmp_path / "crosses.json")
    back = load_crosses(path)
    assert back.search["screen"]["orders"]["3"]["tested"] == 10
    assert back.crosses[0] == dataclasses.replace(top, effect=round(top.effect, 8))
    # too many sets for the budget: that order is skipped, and the report says why
    lines.clear()
    few = fives_search.search(
        schema, table, dataclasses.replace(cfg, screen_max_sets=9), log=lines.append
    )
    assert few.screen["orders"]["3"]["skipped"].startswith("5 fields give 10 sets of 3")
    assert any("order 3 skipped" in m and "screen_max_sets = 9" in m for m in lines)
    assert not any(c.order == 3 and c.active for c in few.crosses)
    # without the screen the same search has no selected triple at all
    plain = fives_search.search(
        schema, table, dataclasses.replace(cfg, screen_orders=()), log=print
    )
    assert not any(c.active and c.order == 3 for c in plain.crosses)
    assert all(c.source == "fives" and c.effect is None for c in plain.crosses)
