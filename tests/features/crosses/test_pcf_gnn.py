"""PCF-GNN pre-training: the encoder against a numpy reference, the leakage guard, training,
the artifact round trip and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from features.crosses.artifact import CrossArtifactError
from features.crosses.pcf_artifact import PCFArtifact, head_forward
from features.crosses.pcf_config import PCFGNNConfig
from features.crosses.pcf_gnn import PCFGNN, evaluate_pairs, pretrain, table_lookup
from features.crosses.pcf_graph import PairGraph, Relation
from features.read_report import DataError


def _graph(seed: int = 0, users: int = 30, items: int = 20, tags: int = 4) -> PairGraph:
    """Users of two kinds: kind k clicks items of parity k; pairs sampled at random."""
    rng = np.random.default_rng(seed)
    u, v = np.meshgrid(np.arange(1, users + 1), np.arange(1, items + 1), indexing="ij")
    u, v = u.ravel(), v.ravel()
    keep = rng.random(u.size) < 0.5
    u, v = u[keep], v[keep]
    imp = rng.integers(1, 20, u.size)
    p = np.where((u % 2) == (v % 2), 0.8, 0.1)
    clicks = rng.binomial(imp, p).astype(np.float64)
    ut = np.repeat(np.arange(1, users + 1), tags)
    tt = np.tile(np.arange(1, tags + 1), users)
    imp_t = rng.integers(1, 5, ut.size)
    return PairGraph(
        fields=["user", "item", "tag"],
        vocab={
            "user": [f"u{i}" for i in range(users)],
            "item": [f"i{i}" for i in range(items)],
            "tag": [f"t{i}" for i in range(tags)],
        },
        counts={"user": [1] * users, "item": [1] * items, "tag": [1] * tags},
        relations=[
            Relation(("user", "item"), u.astype(np.int32), v.astype(np.int32), clicks, imp),
            Relation(
                ("user", "tag"),
                ut.astype(np.int32),
                tt.astype(np.int32),
                rng.binomial(imp_t, 0.3).astype(np.float64),
                imp_t,
            ),
        ],
        prior=0.4,
        alpha=2.0,
    )


def _reference_encode(model: PCFGNN, graph: PairGraph, drop: set[int] = frozenset()) -> np.ndarray:
    """h^K by the module docstring's formula, in plain numpy loops over nodes."""
    h = model.embedding.numpy().astype(np.float64)
    off = graph.offsets
    prior_logit = np.log(graph.prior / (1 - graph.prior))
    for k in range(model.config.layers):
        new = h @ model.self_kernels[k].numpy() + model.biases[k].numpy()
        start = 0
        for r, rel in enumerate(graph.relations):
            a, b = rel.pair
            stat = np.clip(graph.statistic(r), 1e-4, 1 - 1e-4)
            feat = np.log(stat / (1 - stat)) - prior_logit
            for j, (dst_f, src_f, dst, src) in enumerate(
                [(a, b, rel.u, rel.v), (b, a, rel.v, rel.u)]
            ):
                w = model.rel_kernels[k][2 * r + j].numpy()
                for node in np.unique(dst):
                    idx = [e for e in np.flatnonzero(dst == node) if start + e not in drop]
                    if not idx:
                        continue
                    msgs = np.concatenate([h[off[src_f] + src[idx]], feat[idx][:, None]], axis=1)
                    new[off[dst_f] + node] += msgs.mean(axis=0) @ w
            start += len(rel)
        h = np.maximum(new, 0) if k < model.config.layers - 1 else new
    return h


def test_encoder_matches_reference_and_masks_edges() -> None:
    graph = _graph(users=6, items=5, tags=2)
    model = PCFGNN(graph, PCFGNNConfig(dim=3, layers=2, seed=1))
    np.testing.assert_allclose(model.encode().numpy(), _reference_encode(model, graph), atol=1e-5)
    drop = {0, 3, len(graph.relations[0]) + 1}  # supervision edges of a step
    mask = np.ones(graph.num_edges, np.float32)
    mask[list(drop)] = 0
    np.testing.assert_allclose(
        model.encode(tf.constant(mask)).numpy(), _reference_encode(model, graph, drop), atol=1e-5
    )


def test_loss_hides_the_supervised_edges_from_message_passing() -> None:
    """A step's loss must not depend on the statistics of the edges it predicts except through
    the target: changing a supervised edge's statistic changes only the target term."""
    graph = _graph(users=6, items=5, tags=2)
    model = PCFGNN(graph, PCFGNNConfig(dim=3, layers=2, seed=1))
    batch = tf.constant([0, 1], tf.int64)
    mask = np.ones(graph.num_edges, np.float32)
    mask[:2] = 0
    h_masked = model.encode(tf.constant(mask)).numpy()
    graph.relations[0].clicks[:2] = graph.relations[0].impressions[:2]  # new statistics
    other = PCFGNN(graph, PCFGNNConfig(dim=3, layers=2, seed=1))
    np.testing.assert_allclose(other.encode(tf.constant(mask)).numpy(), h_masked, atol=1e-6)
    assert float(model.loss(batch)) != pytest.approx(float(other.loss(batch)))


def test_head_numpy_matches_model() -> None:
    graph = _graph()
    model = PCFGNN(graph, PCFGNNConfig(dim=4, head=(5, 3), seed=2))
    h = model.encode().numpy()
    u, v = model.gu.numpy()[:7], model.gv.numpy()[:7]
    rel = model.edge_relation.numpy()[:7]
    tf_p = tf.sigmoid(model.head_logits(h[u], h[v], tf.constant(rel))).numpy()
    head = [(w.numpy(), b.numpy()) for w, b in model.head]
    np_p = head_forward(h[u], h[v], model.relation_vectors.numpy()[rel], head)
    np.testing.assert_allclose(np_p, tf_p, rtol=1e-5)


def test_pretraining_learns_and_generalises(tmp_path: Path) -> None:
    graph = _graph(seed=0)
    held = _graph(seed=1)  # other draws of the same users and items: many unseen pairs
    logs: list[str] = []
    art = pretrain(
        graph,
        PCFGNNConfig(steps=80, batch_edges=128, learning_rate=0.02, log_every=20, seed=0),
        log=logs.append,
    )
    assert [line.split()[2] for line in logs[1:]] == ["20/80", "40/80", "60/80", "80/80"]
    # the loss falls well below that of predicting the prior for every pair
    stat = np.concatenate([graph.statistic(r) for r in range(2)])
    w = np.log1p(np.concatenate([r.impressions for r in graph.relations]))
    prior_loss = np.sum(w * (stat - graph.prior) ** 2) / np.sum(w)
    assert art.history[-1]["loss"] < 0.5 * prior_loss
    table = evaluate_pairs(None, held, graph)
    gnn = evaluate_pairs(art, held, graph)
    assert table["unseen"]["pairs"] > 50
    # unseen pairs: the table can only say the prior; PCF-GNN ranks them by the planted rule
    assert np.isnan(table["unseen"]["pearson"])
    assert gnn["unseen"]["pearson"] > 0.8
    assert gnn["unseen"]["rmse"] < 0.7 * table["unseen"]["rmse"]

    back = PCFArtifact.load(art.save(tmp_path / "a", graph))
    u = np.array([1, 2, 3])
    np.testing.assert_allclose(back.predict(0, u, u), art.predict(0, u, u))
    assert back.pairs == [("user", "item"), ("user", "tag")]
    assert PairGraph.load(tmp_path / "a" / "graph").num_edges == graph.num_edges
    sizes = back.serving_bytes()
    assert sizes["parameters"] == 4 * (
        art.nodes.size + art.relations.size + sum(w.size + b.size for w, b in art.head)
    )
    with pytest.raises(FileNotFoundError, match="crosses pcf-gnn"):
        PCFArtifact.load(tmp_path)
    _damaged_artifacts_are_one_error(tmp_path / "a")


def _damaged_artifacts_are_one_error(a: Path) -> None:
    """A damaged artifact is one error naming its folder (a copy per damage)."""
    damages = {
        "pcf_gnn.json": (b"[1]", DataError, "holds a JSON array, not an object"),
        "pcf_gnn.npz": (b"not a zip", CrossArtifactError, "cannot be read (ValueError"),
    }
    for name, (raw, error, expected) in damages.items():
        copy = a.parent / f"damaged-{name}"
        shutil.copytree(a, copy)
        (copy / name).write_bytes(raw)
        with pytest.raises(error) as err:
            PCFArtifact.load(copy)
        assert str(copy) in str(err.value) and expected in str(err.value), err.value
    copy = a.parent / "damaged-meta"
    shutil.copytree(a, copy)
    meta = json.loads((copy / "pcf_gnn.json").read_text())
    del meta["head_layers"]
    (copy / "pcf_gnn.json").write_text(json.dumps(meta))
    with pytest.raises(CrossArtifactError, match=r"cannot be read \(KeyError: 'head_layers'\)"):
        PCFArtifact.load(copy)


def test_table_lookup_by_hand() -> None:
    graph = _graph(users=3, items=2, tags=1)
    rel = graph.relations[0]
    stat, seen = table_lookup(graph, 0, rel.u[:1], rel.v[:1])
    assert seen[0] and stat[0] == pytest.approx(
        (rel.clicks[0] + 2.0 * 0.4) / (rel.impressions[0] + 2.0)
    )
    stat, seen = table_lookup(graph, 0, np.array([0]), rel.v[:1])  # OOV node: not a key
    assert not seen[0] and stat[0] == 0.4


def test_bad_input_is_refused() -> None:
    graph = _graph(users=3, items=2, tags=1)
    graph.relations[1].impressions[0] = 0  # a zero-impression pair slipped in after the build
    with pytest.raises(DataError, match="impressions >= 1"):
        pretrain(graph, PCFGNNConfig(steps=1))
    with pytest.raises(ValueError, match="layers must be an integer >= 0"):
        PCFGNNConfig(layers=-1)
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        PCFGNNConfig(learning_rate=float("nan"))
    with pytest.raises(ValueError, match="head sizes must be >= 1"):
        PCFGNNConfig(head=(0,))
    empty = _graph(users=2, items=2, tags=1)
    for rel in empty.relations:
        for key in ("u", "v", "clicks", "impressions"):
            setattr(rel, key, getattr(rel, key)[:0])
    with pytest.raises(ValueError, match="no edges"):
        pretrain(empty, PCFGNNConfig(steps=1))
