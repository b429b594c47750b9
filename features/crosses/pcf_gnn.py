"""PCF-GNN pre-training: a relation-aware GNN over the pair graph and an edge head that predicts
each pair's smoothed CTR; the cached node vectors and the head are the serving artifact.

PCF-GNN (SIGIR'21, arXiv 2105.07752). On the graph of ``features.crosses.pcf_graph`` (nodes = values of
chosen fields, edges = co-occurring pairs with a statistic ``a_uv``), with ``N_r(i)`` the
neighbours of node ``i`` through relation direction ``r`` and ``s_ij`` the edge feature
``logit(a_ij) - logit(prior)``::

    h_i^0 = E[i]                                                   (learned node embedding)
    m_i,r^k = mean_{j in N_r(i)} [h_j^(k-1) ; s_ij]                (per-relation mean)
    h_i^k = act(W_self^k h_i^(k-1) + sum_r W_r^k m_i,r^k + b^k)     (act = ReLU, none at k = K)
    p_uv  = sigmoid(MLP([h_u^K ; h_v^K ; h_u^K * h_v^K ; R[rel(u, v)]]))    (the edge head)
    loss  = sum_(u,v) w_uv (p_uv - a_uv)^2 / sum w_uv,   w_uv = log(1 + impressions_uv)

Each relation ``(a, b)`` has two directions (``a`` nodes hear ``b`` nodes and back), each with its
own ``W_r``. Training samples a batch of supervision edges per step and removes them from the
message passing of that step, so a pair's own statistic never reaches the node vectors that
predict it (otherwise the encoder would learn to copy it, which does not generalise to unseen
pairs). After training, ``h^K`` of every node is computed once over all edges and cached:
serving holds the node table ``[num_nodes, dim]``, the relation table and the head, no graph
(``features.crosses.pcf_artifact``). Nodes unseen in pre-training fall back to their field's OOV
node (``features.crosses.pcf_graph``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from features.crosses.pcf_artifact import PCFArtifact, logit
from features.crosses.pcf_config import PCFGNNConfig
from features.crosses.pcf_graph import PairGraph, smoothed_ctr

Log = Callable[[str], None]


class PCFGNN(tf.Module):
    """The encoder and edge head over one ``PairGraph`` (see the module docstring)."""

    def __init__(self, graph: PairGraph, config: PCFGNNConfig):
        super().__init__(name="pcf_gnn")
        if graph.num_edges == 0:
            raise ValueError("the pair graph has no edges: nothing to pre-train on")
        self.graph = graph
        self.config = config
        c = config
        init = tf.keras.initializers.GlorotUniform(seed=c.seed)
        self.offsets = graph.offsets
        self.sizes = {f: len(graph.vocab[f]) + 1 for f in graph.fields}
        n_rel = len(graph.relations)
        rng = np.random.default_rng(c.seed)
        self.embedding = tf.Variable(
            rng.normal(0.0, 0.1, (graph.num_nodes, c.dim)).astype(np.float32), name="embedding"
        )
        self.self_kernels = [
            tf.Variable(init((c.dim, c.dim)), name=f"self_{k}") for k in range(c.layers)
        ]
        self.rel_kernels = [
            [tf.Variable(init((c.dim + 1, c.dim)), name=f"rel_{k}_{j}") for j in range(2 * n_rel)]
            for k in range(c.layers)
        ]
        self.biases = [tf.Variable(tf.zeros([c.dim]), name=f"bias_{k}") for k in range(c.layers)]
        self.relation_vectors = tf.Variable(
            rng.normal(0.0, 0.1, (n_rel, c.relation_dim)).astype(np.float32), name="relations"
        )
        sizes = [3 * c.dim + c.relation_dim, *c.head, 1]
        self.head = []
        for i in range(len(sizes) - 1):
            bias = np.zeros(sizes[i + 1], np.float32)
            if i == len(sizes) - 2:
                bias[:] = float(logit(graph.prior))
            self.head.append(
                (
                    tf.Variable(init((sizes[i], sizes[i + 1])), name=f"head_{i}_kernel"),
                    tf.Variable(bias, name=f"head_{i}_bias"),
                )
            )
        # edges, flattened over relations: global node ids, relation, target, weight
        gu, gv, rel, target, weight, feature = [], [], [], [], [], []
        for r, relation in enumerate(graph.relations):
            a, b = relation.pair
            stat = graph.statistic(r)
            gu.append(self.offsets[a] + relation.u.astype(np.int64))
            gv.append(self.offsets[b] + relation.v.astype(np.int64))
            rel.append(np.full(len(relation), r, np.int64))
            target.append(stat)
            weight.append(np.log1p(relation.impressions.astype(np.float64)))
            feature.append(logit(stat) - logit(graph.prior))
        self.num_edges = graph.num_edges
        self.gu = tf.constant(np.concatenate(gu))
        self.gv = tf.constant(np.concatenate(gv))
        self.edge_relation = tf.constant(np.concatenate(rel))
        self.target = tf.constant(np.concatenate(target), tf.float32)
        self.weight = tf.constant(np.concatenate(weight), tf.float32)
        feature = tf.constant(np.concatenate(feature), tf.float32)
        # message directions: 2r (b -> a) and 2r + 1 (a -> b), each over relation r's edges
        self.directions = []
        start = 0
        for relation in graph.relations:
            a, b = relation.pair
            n = len(relation)
            eid = tf.range(start, start + n, dtype=tf.int64)
            ua = tf.constant(relation.u.astype(np.int64))
            vb = tf.constant(relation.v.astype(np.int64))
            gua = ua + self.offsets[a]
            gvb = vb + self.offsets[b]
            f = feature[start : start + n]
            self.directions.append({"dst_field": a, "dst": ua, "src": gvb, "eid": eid, "f": f})
            self.directions.append({"dst_field": b, "dst": vb, "src": gua, "eid": eid, "f": f})
            start += n

    def encode(self, mask: tf.Tensor | None = None) -> tf.Tensor:
        """``h^K`` of every node, ``[num_nodes, dim]``; ``mask`` ``[E]`` (1 keep, 0 drop)
        removes edges from the message passing."""
        h = self.embedding
        fields = self.graph.fields
        for k in range(self.config.layers):
            parts = {f: h[self.offsets[f] : self.offsets[f] + self.sizes[f]] for f in fields}
            out = {f: tf.matmul(parts[f], self.self_kernels[k]) for f in fields}
            for j, d in enumerate(self.directions):
                m = tf.concat([tf.gather(h, d["src"]), d["f"][:, None]], axis=1)
                w = (
                    tf.gather(mask, d["eid"])
                    if mask is not None
                    else tf.ones_like(d["f"], tf.float32)
                )
                n = self.sizes[d["dst_field"]]
                total = tf.math.unsorted_segment_sum(m * w[:, None], d["dst"], n)
                count = tf.math.unsorted_segment_sum(w, d["dst"], n)
                mean = total / tf.maximum(count, 1.0)[:, None]
                out[d["dst_field"]] += tf.matmul(mean, self.rel_kernels[k][j])
            h = tf.concat([out[f] for f in fields], axis=0) + self.biases[k]
            if k < self.config.layers - 1:
                h = tf.nn.relu(h)
        return h

    def head_logits(self, hu: tf.Tensor, hv: tf.Tensor, relation: tf.Tensor) -> tf.Tensor:
        x = tf.concat([hu, hv, hu * hv, tf.gather(self.relation_vectors, relation)], axis=1)
        for i, (w, b) in enumerate(self.head):
            x = tf.matmul(x, w) + b
            if i < len(self.head) - 1:
                x = tf.nn.relu(x)
        return x[:, 0]

    def loss(self, batch: tf.Tensor) -> tf.Tensor:
        """Weighted squared error of the batch's edges (removed from the message passing)."""
        mask = tf.tensor_scatter_nd_update(
            tf.ones([self.num_edges], tf.float32),
            batch[:, None],
            tf.zeros_like(batch, tf.float32),
        )
        h = self.encode(mask)
        u, v = tf.gather(self.gu, batch), tf.gather(self.gv, batch)
        p = tf.sigmoid(
            self.head_logits(tf.gather(h, u), tf.gather(h, v), tf.gather(self.edge_relation, batch))
        )
        w = tf.gather(self.weight, batch)
        err = tf.reduce_sum(w * tf.square(p - tf.gather(self.target, batch))) / tf.reduce_sum(w)
        l2 = tf.reduce_sum(tf.square(tf.gather(self.embedding, tf.concat([u, v], 0))))
        return err + self.config.l2 * l2

    def artifact(self) -> PCFArtifact:
        """Caches ``h^K`` over all edges and packs what serving needs."""
        g = self.graph
        return PCFArtifact(
            fields=list(g.fields),
            vocab=g.vocab,
            multi=dict(g.multi),
            pairs=list(g.pairs),
            nodes=self.encode().numpy().astype(np.float32),
            relations=self.relation_vectors.numpy(),
            head=[(w.numpy(), b.numpy()) for w, b in self.head],
            prior=g.prior,
            alpha=g.alpha,
            config=dataclasses.asdict(self.config),
        )


def weighted_rmse(pred: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None) -> float:
    w = np.ones_like(target) if weight is None else weight
    return float(np.sqrt(np.sum(w * (pred - target) ** 2) / max(np.sum(w), 1e-12)))


def pretrain(
    graph: PairGraph,
    config: PCFGNNConfig | None = None,
    *,
    log: Log | None = None,
    valid: PairGraph | None = None,
) -> PCFArtifact:
    """Pre-trains PCF-GNN on ``graph`` and returns the serving artifact.

    Args:
      graph: a validated ``PairGraph`` (``build_graph``).
      config: hyper-parameters (default ``PCFGNNConfig()``).
      log: progress lines (step, loss, steps/s; validation RMSE when ``valid`` is given).
      valid: held-out pairs counted on other rows with the same vocabularies
        (``pair_graph_like``), scored every ``log_every`` steps.
    """
    config = config or PCFGNNConfig()
    log = log or (lambda _: None)
    graph.validate()
    tf.random.set_seed(config.seed)
    model = PCFGNN(graph, config)
    optimizer = tf.keras.optimizers.Adam(config.learning_rate)
    batch = min(config.batch_edges, model.num_edges)
    rng = np.random.default_rng([config.seed, 1])
    variables = model.trainable_variables

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(edges: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = model.loss(edges)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    history: list[dict[str, Any]] = []
    t0 = time.time()
    window: list[float] = []
    log(
        f"pcf-gnn: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
        f"{len(graph.relations)} relations; {config.layers} layers, dim {config.dim}, "
        f"{config.steps} steps of {batch} edges"
    )
    for s in range(1, config.steps + 1):
        edges = rng.choice(model.num_edges, size=batch, replace=False)
        window.append(float(step(tf.constant(edges, tf.int64))))
        if s % config.log_every == 0 or s == config.steps:
            entry: dict[str, Any] = {
                "step": s,
                "loss": float(np.mean(window)),
                "seconds": round(time.time() - t0, 2),
            }
            line = f"pcf-gnn step {s}/{config.steps} loss {entry['loss']:.6f}"
            if valid is not None:
                art = model.artifact()
                m = evaluate_pairs(art, valid, graph)
                entry["valid"] = m
                line += f" valid rmse {m['all']['rmse']:.4f} (unseen {m['unseen']['rmse']:.4f})"
            rate = s / max(time.time() - t0, 1e-9)
            log(f"{line} {rate:.1f} steps/s")
            history.append(entry)
            window = []
    art = model.artifact()
    art.history = history
    return art


def pair_graph_like(graph: PairGraph, relations: list[Any], rows: int = 0) -> PairGraph:
    """A graph of held-out pair counts (``count_pairs`` over other rows with ``graph.vocab``)
    sharing ``graph``'s vocabularies, prior and smoothing."""
    return PairGraph(
        fields=list(graph.fields),
        vocab=graph.vocab,
        counts=graph.counts,
        relations=relations,
        prior=graph.prior,
        alpha=graph.alpha,
        rows=rows,
        multi=dict(graph.multi),
    )


def table_lookup(
    train: PairGraph, r: int, u: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The explicit statistics table: (smoothed training CTR or the prior, seen mask) per pair.

    Pairs on an OOV node are treated as unseen (the table keys raw value pairs; rare values are
    not in it)."""
    rel = train.relations[r]
    size_v = len(train.vocab[rel.pair[1]]) + 1
    keys = rel.u.astype(np.int64) * size_v + rel.v
    order = np.argsort(keys)
    keys, stat = keys[order], train.statistic(r)[order]
    q = np.asarray(u, np.int64) * size_v + np.asarray(v, np.int64)
    idx = np.clip(np.searchsorted(keys, q), 0, max(len(keys) - 1, 0))
    seen = (len(keys) > 0) & (keys[idx] == q) if len(keys) else np.zeros(q.shape, bool)
    seen &= (np.asarray(u) > 0) & (np.asarray(v) > 0)
    return np.where(seen, stat[idx] if len(keys) else train.prior, train.prior), seen


def _metrics(pred: np.ndarray, target: np.ndarray, weight: np.ndarray) -> dict[str, float]:
    if target.size == 0:
        return {"pairs": 0, "rmse": math.nan, "weighted_rmse": math.nan, "pearson": math.nan}
    corr = math.nan
    if target.size > 1 and np.ptp(pred) > 0 and np.ptp(target) > 0:
        corr = float(np.corrcoef(pred, target)[0, 1])
    return {
        "pairs": int(target.size),
        "rmse": weighted_rmse(pred, target),
        "weighted_rmse": weighted_rmse(pred, target, weight),
        "pearson": corr,
    }


def evaluate_pairs(
    artifact: PCFArtifact | None, held_out: PairGraph, train: PairGraph
) -> dict[str, dict[str, float]]:
    """RMSE (plain and log(1+impressions)-weighted) and Pearson correlation of predicted vs.
    held-out smoothed CTR, over all held-out pairs and split by whether the pair was seen in
    ``train``. ``artifact`` None scores the explicit table (``table_lookup``) instead.
    Pairs on an OOV node are left out (neither side is a known value)."""
    preds, targets, weights, seen_all = [], [], [], []
    for r, rel in enumerate(held_out.relations):
        keep = (rel.u > 0) & (rel.v > 0)
        u, v = rel.u[keep], rel.v[keep]
        target = smoothed_ctr(rel.clicks[keep], rel.impressions[keep], train.prior, train.alpha)
        table, seen = table_lookup(train, r, u, v)
        pred = table if artifact is None else artifact.predict(r, u, v)
        preds.append(pred)
        targets.append(target)
        weights.append(np.log1p(rel.impressions[keep].astype(np.float64)))
        seen_all.append(seen)
    p, t, w, s = (np.concatenate(x) for x in (preds, targets, weights, seen_all))
    return {
        "all": _metrics(p, t, w),
        "seen": _metrics(p[s], t[s], w[s]),
        "unseen": _metrics(p[~s], t[~s], w[~s]),
    }
