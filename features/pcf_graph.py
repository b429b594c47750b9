"""PCF-GNN's pre-training graph, built in a streaming pass over Parquet training logs.

PCF-GNN (Pre-trained Cross Feature GNN, SIGIR'21, arXiv 2105.07752) learns explicit cross-feature
statistics from a heterogeneous graph whose

* **nodes** are the values of chosen fields (``userId = 42``, ``movieId = 318``, ``genres =
  Drama``), one node type per field;
* **edges** join two values of a chosen field pair ``(a, b)`` (a *relation*) that occurred in the
  same row, and carry the pair's ``clicks`` (sum of labels), ``impressions`` (rows) and the
  additively smoothed CTR::

      stat(u, v) = (clicks(u, v) + alpha * prior) / (impressions(u, v) + alpha)

  with ``prior`` the training click rate and ``alpha`` the smoothing strength (pseudo-rows).

``build_graph`` reads validated record batches (``features.dataset.iter_record_batches``) twice:
pass 1 counts every value of the node fields, pass 2 counts clicks and impressions of every
co-occurring pair. Memory holds the counts, never the rows.

Node vocabulary (the min-count cap). A field's nodes are its values seen at least ``min_count``
times, most frequent first (ties by value), at most ``max_nodes`` of them. Local id 0 of every
field is its OOV node: rarer values, values cut by ``max_nodes`` and values never seen all map
there, so a field of huge cardinality costs at most ``max_nodes + 1`` nodes and its rare values
share one node whose edges aggregate them (the learned "rare value" representation). Missing
cells (null, ``""``, ``-1`` in int64 fields) are not values: rows where one side of a pair is
missing add no edge to that relation. Multi-valued fields (``separator``) add one edge per value,
``(u, g)`` for each value ``g`` in the cell; at most one field of a pair may be multi-valued.

Bad input never reaches training silently: ``PairGraph`` refuses edges with impressions below 1,
negative clicks, clicks above impressions, and non-finite or out-of-range statistics, raising
``DataError`` naming the relation and the pair. Labels that are not 0/1 and NaN numerics are
refused earlier, by ``iter_record_batches``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.dataset import iter_record_batches
from features.readers import DataError
from features.schema import FeatureKind, Schema

GRAPH_FILE = "graph.json"
_MERGE_EVERY = 16  # batches between merges of the partial count tables

Log = Callable[[str], None]


def relation_name(pair: Sequence[str]) -> str:
    """``("userId", "movieId")`` -> ``"userId x movieId"`` (used in messages and reports)."""
    return f"{pair[0]} x {pair[1]}"


def smoothed_ctr(
    clicks: np.ndarray, impressions: np.ndarray, prior: float, alpha: float
) -> np.ndarray:
    """``(clicks + alpha * prior) / (impressions + alpha)``, float64, elementwise."""
    clicks = np.asarray(clicks, np.float64)
    impressions = np.asarray(impressions, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (clicks + alpha * prior) / (impressions + alpha)


def field_offsets(fields: Sequence[str], vocab: dict[str, Any]) -> dict[str, int]:
    """Global node id of each field's OOV node: fields in order, ``len(vocab[f]) + 1`` nodes
    each (the OOV node, then the field's vocabulary)."""
    out, n = {}, 0
    for f in fields:
        out[f] = n
        n += len(vocab[f]) + 1
    return out


@dataclasses.dataclass
class Relation:
    """The edges of one field pair ``(a, b)``: local node ids ``u`` of ``a``, ``v`` of ``b``."""

    pair: tuple[str, str]
    u: np.ndarray  # int32 [E]
    v: np.ndarray  # int32 [E]
    clicks: np.ndarray  # float64 [E]
    impressions: np.ndarray  # int64 [E]

    @property
    def name(self) -> str:
        return relation_name(self.pair)

    def __len__(self) -> int:
        return int(self.u.shape[0])


@dataclasses.dataclass
class PairGraph:
    """Nodes (per-field vocabularies) and edges (per-relation pair counts); see the module doc.

    Attributes:
      fields: node fields, in order; node ids are global: ``offsets[f] + local id``.
      vocab: ``{field: values}``; local id ``i + 1`` is ``vocab[field][i]``, 0 the OOV node.
      counts: ``{field: training count of each vocab value}``.
      relations: one ``Relation`` per field pair.
      prior: training click rate (the smoothing prior and the default statistic).
      alpha: smoothing strength (pseudo-impressions at the prior).
      rows: training rows read.
      multi: ``{field: separator}`` of the multi-valued node fields.
      report: what the build skipped (missing cells, rare values, dropped edges).
    """

    fields: list[str]
    vocab: dict[str, list[str]]
    counts: dict[str, list[int]]
    relations: list[Relation]
    prior: float
    alpha: float
    rows: int = 0
    multi: dict[str, str] = dataclasses.field(default_factory=dict)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # --- structure ---------------------------------------------------------------------------
    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [r.pair for r in self.relations]

    @property
    def offsets(self) -> dict[str, int]:
        """Global id of each field's OOV node; the field's nodes follow it."""
        return field_offsets(self.fields, self.vocab)

    @property
    def num_nodes(self) -> int:
        return sum(len(self.vocab[f]) + 1 for f in self.fields)

    @property
    def num_edges(self) -> int:
        return sum(len(r) for r in self.relations)

    def statistic(self, r: int) -> np.ndarray:
        """Smoothed CTR of relation ``r``'s edges, float64 ``[E_r]``."""
        rel = self.relations[r]
        return smoothed_ctr(rel.clicks, rel.impressions, self.prior, self.alpha)

    def validate(self) -> None:
        """Raises ``DataError`` for anything that must not reach training (module docstring)."""
        if not (0.0 <= self.prior <= 1.0) or not math.isfinite(self.prior):
            raise DataError(f"pair graph: prior click rate {self.prior!r}, expected in [0, 1]")
        if not (self.alpha >= 0.0) or not math.isfinite(self.alpha):
            raise DataError(f"pair graph: smoothing alpha {self.alpha!r}, expected >= 0")
        for f in self.fields:
            if f not in self.vocab:
                raise DataError(f"pair graph: node field {f!r} has no vocabulary")
        for r, rel in enumerate(self.relations):
            for f in rel.pair:
                if f not in self.vocab:
                    raise DataError(
                        f"pair graph: relation {rel.name!r} names {f!r}, which is not a node "
                        f"field ({self.fields})"
                    )
            n = len(rel)
            if not (rel.v.shape[0] == rel.clicks.shape[0] == rel.impressions.shape[0] == n):
                raise DataError(f"pair graph: relation {rel.name!r}: edge arrays differ in length")
            size_u, size_v = (len(self.vocab[f]) + 1 for f in rel.pair)
            for side, ids, size in (("u", rel.u, size_u), ("v", rel.v, size_v)):
                if n and (ids.min() < 0 or ids.max() >= size):
                    raise DataError(
                        f"pair graph: relation {rel.name!r}: node id of {side} outside [0, {size})"
                    )
            self._refuse(rel, rel.impressions < 1, "impressions", "impressions >= 1")
            self._refuse(rel, ~np.isfinite(rel.clicks), "clicks", "a finite click count")
            self._refuse(rel, rel.clicks < 0, "clicks", "clicks >= 0")
            self._refuse(rel, rel.clicks > rel.impressions, "clicks", "clicks <= impressions")
            stat = self.statistic(r)
            bad = ~np.isfinite(stat) | (stat < 0) | (stat > 1)
            self._refuse(rel, bad, "statistic", "a finite smoothed CTR in [0, 1]")

    def _refuse(self, rel: Relation, bad: np.ndarray, what: str, expected: str) -> None:
        if not bad.any():
            return
        i = int(np.argmax(bad))
        a = self.value_of(rel.pair[0], int(rel.u[i]))
        b = self.value_of(rel.pair[1], int(rel.v[i]))
        raise DataError(
            f"pair graph: relation {rel.name!r}, pair ({a!r}, {b!r}): {what} = "
            f"{self._edge_summary(rel, i)}; expected {expected} ({int(bad.sum())} such edge(s))"
        )

    def _edge_summary(self, rel: Relation, i: int) -> str:
        return f"clicks {rel.clicks[i]!r}, impressions {rel.impressions[i]!r}"

    def value_of(self, field: str, local: int) -> str:
        """The raw value of a local node id (``"<OOV>"`` for id 0)."""
        return "<OOV>" if local == 0 else self.vocab[field][local - 1]

    def local_ids(self, field: str, values: pa.Array | pa.ChunkedArray | Sequence) -> np.ndarray:
        """Raw values (strings or ints) -> local node ids, int32; missing -> -1, unknown -> 0."""
        if not isinstance(values, pa.Array | pa.ChunkedArray):
            values = pa.array(list(values))
        return _local_ids(values, pa.array(self.vocab[field], pa.string()))

    # --- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Writes ``graph.json``, ``vocab/<i>.parquet`` and ``edges/<i>.parquet``."""
        d = Path(directory)
        (d / "vocab").mkdir(parents=True, exist_ok=True)
        (d / "edges").mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(self.fields):
            pq.write_table(
                pa.table(
                    {
                        "value": pa.array(self.vocab[f], pa.string()),
                        "count": pa.array(self.counts[f], pa.int64()),
                    }
                ),
                d / "vocab" / f"{i}.parquet",
            )
        for i, rel in enumerate(self.relations):
            pq.write_table(
                pa.table(
                    {
                        "u": rel.u,
                        "v": rel.v,
                        "clicks": rel.clicks,
                        "impressions": rel.impressions,
                    }
                ),
                d / "edges" / f"{i}.parquet",
            )
        meta = {
            "fields": self.fields,
            "pairs": [list(p) for p in self.pairs],
            "prior": self.prior,
            "alpha": self.alpha,
            "rows": self.rows,
            "multi": self.multi,
            "report": self.report,
        }
        (d / GRAPH_FILE).write_text(json.dumps(meta, indent=1))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> PairGraph:
        d = Path(directory)
        if not (d / GRAPH_FILE).exists():
            raise FileNotFoundError(f"{d}: no {GRAPH_FILE} (not a PCF-GNN pair graph)")
        meta = json.loads((d / GRAPH_FILE).read_text())
        vocab, counts = {}, {}
        for i, f in enumerate(meta["fields"]):
            t = pq.read_table(d / "vocab" / f"{i}.parquet")
            vocab[f] = t.column("value").to_pylist()
            counts[f] = t.column("count").to_pylist()
        relations = []
        for i, pair in enumerate(meta["pairs"]):
            t = pq.read_table(d / "edges" / f"{i}.parquet")
            relations.append(
                Relation(
                    (pair[0], pair[1]),
                    t.column("u").to_numpy().astype(np.int32),
                    t.column("v").to_numpy().astype(np.int32),
                    t.column("clicks").to_numpy().astype(np.float64),
                    t.column("impressions").to_numpy().astype(np.int64),
                )
            )
        return cls(
            fields=meta["fields"],
            vocab=vocab,
            counts=counts,
            relations=relations,
            prior=meta["prior"],
            alpha=meta["alpha"],
            rows=meta["rows"],
            multi=meta.get("multi", {}),
            report=meta.get("report", {}),
        )


# --- building ---------------------------------------------------------------------------------
def _strings(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as strings with missing cells as null (int64 -1 is missing, as in the data)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_integer(col.type):
        col = pc.if_else(pc.equal(col, -1), pa.scalar(None, col.type), col)
    col = pc.cast(col, pa.string())
    return pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.string()), col)


def _local_ids(values: pa.Array | pa.ChunkedArray, vocab: pa.Array) -> np.ndarray:
    s = _strings(values)
    idx = pc.index_in(s, value_set=vocab)
    ids = pc.fill_null(pc.add(idx, 1), 0).to_numpy(zero_copy_only=False).astype(np.int32)
    ids[pc.is_null(s).to_numpy(zero_copy_only=False)] = -1
    return ids


def _expand(col: pa.Array, separator: str | None) -> tuple[np.ndarray, pa.Array]:
    """(row index of each value, values): one value per row, or the split multi-valued cells."""
    s = _strings(col)
    if separator is None:
        return np.arange(len(s), dtype=np.int64), s
    lists = pc.split_pattern(pc.fill_null(s, ""), separator)
    flat = pc.list_flatten(lists)
    rows = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
    flat = pc.if_else(pc.equal(flat, ""), pa.scalar(None, pa.string()), flat)
    return rows, flat


def _merge(parts: list[pa.Table], key: str, sums: Sequence[str]) -> pa.Table:
    t = pa.concat_tables(parts).group_by(key).aggregate([(s, "sum") for s in sums])
    return pa.table({key: t.column(key), **{s: t.column(f"{s}_sum") for s in sums}})


def _check_pairs(schema: Schema, pairs: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    if not pairs:
        raise ValueError("PCF-GNN needs at least one field pair, e.g. [['userId', 'movieId']]")
    out: list[tuple[str, str]] = []
    for p in pairs:
        if isinstance(p, str) or len(p) != 2:
            raise ValueError(f"field pair {p!r}: expected two field names, e.g. ['a', 'b']")
        a, b = str(p[0]), str(p[1])
        if a == b:
            raise ValueError(f"field pair {[a, b]}: a pair needs two different fields")
        for f in (a, b):
            spec = schema.field(f)
            if spec.kind not in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL):
                raise ValueError(
                    f"field pair {[a, b]}: {f!r} is {spec.kind.value}; pairs need categorical "
                    f"or multi_categorical fields"
                )
        kinds = [schema.field(f).kind for f in (a, b)]
        if kinds.count(FeatureKind.MULTI_CATEGORICAL) == 2:
            raise ValueError(
                f"field pair {[a, b]}: at most one field of a pair may be multi_categorical"
            )
        if (a, b) in out or (b, a) in out:
            raise ValueError(f"field pair {[a, b]} is given twice")
        out.append((a, b))
    return out


def count_values(
    schema: Schema,
    batches: Iterable[pa.RecordBatch],
    fields: Sequence[str],
) -> tuple[dict[str, pa.Table], int, float, int]:
    """Pass 1: ``({field: table(value, count)}, rows, clicks, missing cells)``."""
    label = schema.label.name
    parts: dict[str, list[pa.Table]] = {f: [] for f in fields}
    rows, clicks, missing = 0, 0.0, 0
    for rb in batches:
        rows += rb.num_rows
        clicks += float(pc.sum(rb.column(label)).as_py() or 0.0)
        for f in fields:
            spec = schema.field(f)
            sep = spec.separator if spec.kind == FeatureKind.MULTI_CATEGORICAL else None
            _, values = _expand(rb.column(f), sep)
            missing += values.null_count
            vc = pc.value_counts(values.drop_null())
            parts[f].append(
                pa.table(
                    {"value": vc.field("values"), "count": pc.cast(vc.field("counts"), "int64")}
                )
            )
            if len(parts[f]) >= _MERGE_EVERY:
                parts[f] = [_merge(parts[f], "value", ["count"])]
    merged = {
        f: _merge(p, "value", ["count"])
        if p
        else pa.table({"value": pa.array([], pa.string()), "count": pa.array([], pa.int64())})
        for f, p in parts.items()
    }
    return merged, rows, clicks, missing


def node_vocabulary(
    counts: pa.Table, min_count: int, max_nodes: int | None
) -> tuple[list[str], list[int], int]:
    """Values with count >= ``min_count``, most frequent first (ties by value), at most
    ``max_nodes``; returns (values, counts, number of distinct values cut to the OOV node)."""
    t = counts.filter(pc.greater_equal(counts.column("count"), min_count))
    t = t.sort_by([("count", "descending"), ("value", "ascending")])
    if max_nodes is not None:
        t = t.slice(0, max_nodes)
    return (
        t.column("value").to_pylist(),
        t.column("count").to_pylist(),
        counts.num_rows - t.num_rows,
    )


def count_pairs(
    schema: Schema,
    batches: Iterable[pa.RecordBatch],
    pairs: Sequence[tuple[str, str]],
    vocab: dict[str, list[str]],
) -> tuple[list[pa.Table], dict[str, int]]:
    """Pass 2: per pair, ``table(u, v, clicks, impressions)`` over local node ids, and counts of
    skipped (missing-side) values. Pairs of values outside ``vocab`` land on OOV node 0."""
    label = schema.label.name
    sets = {f: pa.array(v, pa.string()) for f, v in vocab.items()}
    sizes = {f: len(v) + 1 for f, v in vocab.items()}
    parts: list[list[pa.Table]] = [[] for _ in pairs]
    skipped = {relation_name(p): 0 for p in pairs}
    for rb in batches:
        y = rb.column(label).to_numpy(zero_copy_only=False).astype(np.float64)
        for r, (a, b) in enumerate(pairs):
            sa, sb = schema.field(a), schema.field(b)
            sep_a = sa.separator if sa.kind == FeatureKind.MULTI_CATEGORICAL else None
            sep_b = sb.separator if sb.kind == FeatureKind.MULTI_CATEGORICAL else None
            rows_a, va = _expand(rb.column(a), sep_a)
            rows_b, vb = _expand(rb.column(b), sep_b)
            ua = _local_ids(va, sets[a])
            ub = _local_ids(vb, sets[b])
            if sep_a is None and sep_b is None:
                u, v, rows = ua, ub, rows_a
            elif sep_a is not None:  # one entry per value of a; b repeated
                u, v, rows = ua, ub[rows_a], rows_a
            else:
                u, v, rows = ua[rows_b], ub, rows_b
            keep = (u >= 0) & (v >= 0)
            skipped[relation_name((a, b))] += int((~keep).sum())
            key = u[keep].astype(np.int64) * sizes[b] + v[keep]
            t = pa.table(
                {
                    "key": key,
                    "clicks": y[rows[keep]],
                    "impressions": np.ones(key.shape[0], np.int64),
                }
            )
            parts[r].append(_merge([t], "key", ["clicks", "impressions"]))
            if len(parts[r]) >= _MERGE_EVERY:
                parts[r] = [_merge(parts[r], "key", ["clicks", "impressions"])]
    tables = []
    for r, (_, b) in enumerate(pairs):
        if parts[r]:
            t = _merge(parts[r], "key", ["clicks", "impressions"]).sort_by("key")
        else:
            t = pa.table(
                {
                    "key": pa.array([], pa.int64()),
                    "clicks": pa.array([], pa.float64()),
                    "impressions": pa.array([], pa.int64()),
                }
            )
        key = t.column("key").to_numpy()
        tables.append(
            pa.table(
                {
                    "u": (key // sizes[b]).astype(np.int32),
                    "v": (key % sizes[b]).astype(np.int32),
                    "clicks": t.column("clicks").to_numpy().astype(np.float64),
                    "impressions": t.column("impressions").to_numpy().astype(np.int64),
                }
            )
        )
    return tables, skipped


def build_graph(
    schema: Schema,
    files: Sequence[Path],
    pairs: Sequence[Sequence[str]],
    *,
    min_count: int = 1,
    max_nodes: int | None = None,
    alpha: float = 10.0,
    min_impressions: int = 1,
    batch_rows: int = 65_536,
    log: Log | None = None,
) -> PairGraph:
    """Builds the PCF-GNN graph of ``pairs`` from Parquet ``files`` (two streaming passes).

    Args:
      schema: the schema of the shards (``Schema.as_parquet()``).
      pairs: field pairs ``[(a, b), ...]``; categorical or multi_categorical fields.
      min_count: values seen fewer times map to their field's OOV node (the cardinality cap).
      max_nodes: keep at most this many values per field, most frequent first (None: no cap).
      alpha: smoothing strength of the smoothed CTR (pseudo-impressions at the prior), >= 0.
      min_impressions: edges with fewer impressions are dropped (and counted in ``report``).

    Returns a validated ``PairGraph``; raises ``DataError`` for bad data, ``ValueError`` for bad
    arguments.
    """
    pairs = _check_pairs(schema, pairs)
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
    if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes < 1):
        raise ValueError(f"max_nodes must be None or an integer >= 1, got {max_nodes!r}")
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if not isinstance(min_impressions, int) or min_impressions < 1:
        raise ValueError(f"min_impressions must be an integer >= 1, got {min_impressions!r}")
    log = log or (lambda _: None)
    fields = list(dict.fromkeys(f for p in pairs for f in p))
    specs = [schema.field(f) for f in fields]
    read = [*specs, schema.label]

    t0 = time.time()
    counts, rows, clicks, missing = count_values(
        schema, iter_record_batches(schema, files, read, batch_rows), fields
    )
    if rows == 0:
        raise DataError(f"no training rows in {[str(f) for f in files]} to build a pair graph")
    vocab, vcounts, cut = {}, {}, {}
    for f in fields:
        vocab[f], vcounts[f], cut[f] = node_vocabulary(counts[f], min_count, max_nodes)
    log(
        f"pcf graph pass 1: {rows:,} rows in {time.time() - t0:.1f}s; nodes "
        + ", ".join(f"{f}={len(vocab[f]) + 1} ({cut[f]} values to OOV)" for f in fields)
    )
    t1 = time.time()
    tables, skipped = count_pairs(
        schema, iter_record_batches(schema, files, read, batch_rows), pairs, vocab
    )
    relations, dropped = [], {}
    for (a, b), t in zip(pairs, tables, strict=True):
        keep = pc.greater_equal(t.column("impressions"), min_impressions)
        dropped[relation_name((a, b))] = t.num_rows - int(pc.sum(keep).as_py() or 0)
        t = t.filter(keep)
        relations.append(
            Relation(
                (a, b),
                t.column("u").to_numpy().astype(np.int32),
                t.column("v").to_numpy().astype(np.int32),
                t.column("clicks").to_numpy().astype(np.float64),
                t.column("impressions").to_numpy().astype(np.int64),
            )
        )
    graph = PairGraph(
        fields=fields,
        vocab=vocab,
        counts=vcounts,
        relations=relations,
        prior=clicks / rows,
        alpha=float(alpha),
        rows=rows,
        multi={s.name: s.separator for s in specs if s.kind == FeatureKind.MULTI_CATEGORICAL},
        report={
            "min_count": min_count,
            "max_nodes": max_nodes,
            "min_impressions": min_impressions,
            "missing_values": missing,
            "values_to_oov": cut,
            "edges_missing_side": skipped,
            "edges_below_min_impressions": dropped,
            "seconds": round(time.time() - t0, 2),
        },
    )
    log(
        f"pcf graph pass 2: {graph.num_edges:,} edges in {time.time() - t1:.1f}s ("
        + ", ".join(f"{r.name}={len(r):,}" for r in relations)
        + f"); prior CTR {graph.prior:.4f}"
    )
    return graph
