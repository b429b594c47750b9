"""Building PCF-GNN's pair graph in two streaming passes over validated record batches.

Pass 1 (``count_values``) counts every value of the node fields and ``node_vocabulary`` keeps
the values seen ``min_count`` times; pass 2 (``count_pairs``) counts clicks and impressions of
every co-occurring pair. ``build_graph`` runs both and returns a validated ``PairGraph``
(``features.crosses.pcf_graph`` describes the graph and its vocabulary rules).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.crosses.pcf_graph import (
    Log,
    PairGraph,
    Relation,
    relation_name,
    value_strings,
    vocab_ids,
)
from features.partitions import ShardPart, shard_parts
from features.read_report import DataError
from features.schema import FeatureKind, FeatureSpec, Schema
from features.shard_reader import iter_record_batches
from features.tasks import TaskRunner, runner_or_local

_MERGE_EVERY = 16  # batches between merges of the partial count tables


def _expand(col: pa.Array, separator: str | None) -> tuple[np.ndarray, pa.Array]:
    """(row index of each value, values): one value per row, or the split multi-valued cells."""
    s = value_strings(col)
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
    keyed, skipped = count_pair_keys(schema, batches, pairs, vocab)
    sizes = {f: len(v) + 1 for f, v in vocab.items()}
    return [_uv_table(t, sizes[b]) for t, (_, b) in zip(keyed, pairs, strict=True)], skipped


def count_pair_keys(
    schema: Schema,
    batches: Iterable[pa.RecordBatch],
    pairs: Sequence[tuple[str, str]],
    vocab: dict[str, list[str]],
) -> tuple[list[pa.Table], dict[str, int]]:
    """Pass 2's partial counts: per pair, ``table(key, clicks, impressions)`` with ``key = u *
    (nodes of b) + v`` (summed per key, unsorted; ``_merge`` adds such tables), and the skipped
    values."""
    label = schema.label.name
    sets = {f: pa.array(v, pa.string()) for f, v in vocab.items()}
    sizes = {f: len(v) + 1 for f, v in vocab.items()}
    parts: list[list[pa.Table]] = [[] for _ in pairs]
    skipped = {relation_name(p): 0 for p in pairs}
    for rb in batches:
        y = rb.column(label).to_numpy(zero_copy_only=False).astype(np.float64)
        for r, (a, b) in enumerate(pairs):
            u, v, rows = _pair_ids(schema, rb, a, b, sets)
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
    return [_merge_keys(p) for p in parts], skipped


def _pair_ids(
    schema: Schema, rb: pa.RecordBatch, a: str, b: str, sets: dict[str, pa.Array]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local node ids ``u`` of ``a`` and ``v`` of ``b`` of every co-occurring pair of ``rb``,
    and each pair's row (-1: a value outside the field's nodes, or missing)."""
    sa, sb = schema.field(a), schema.field(b)
    sep_a = sa.separator if sa.kind == FeatureKind.MULTI_CATEGORICAL else None
    sep_b = sb.separator if sb.kind == FeatureKind.MULTI_CATEGORICAL else None
    rows_a, va = _expand(rb.column(a), sep_a)
    rows_b, vb = _expand(rb.column(b), sep_b)
    ua = vocab_ids(va, sets[a])
    ub = vocab_ids(vb, sets[b])
    if sep_a is None and sep_b is None:
        return ua, ub, rows_a
    if sep_a is not None:  # one entry per value of a; b repeated
        return ua, ub[rows_a], rows_a
    return ua[rows_b], ub, rows_b


def _merge_keys(parts: list[pa.Table]) -> pa.Table:
    """The keyed partial tables ``parts`` summed per key (an empty table when none)."""
    if parts:
        return _merge(parts, "key", ["clicks", "impressions"])
    return pa.table(
        {
            "key": pa.array([], pa.int64()),
            "clicks": pa.array([], pa.float64()),
            "impressions": pa.array([], pa.int64()),
        }
    )


def _uv_table(keyed: pa.Table, size_b: int) -> pa.Table:
    """A keyed table as ``table(u, v, clicks, impressions)``, sorted by ``(u, v)``."""
    t = keyed.sort_by("key")
    key = t.column("key").to_numpy()
    return pa.table(
        {
            "u": (key // size_b).astype(np.int32),
            "v": (key % size_b).astype(np.int32),
            "clicks": t.column("clicks").to_numpy().astype(np.float64),
            "impressions": t.column("impressions").to_numpy().astype(np.int64),
        }
    )


@dataclasses.dataclass(frozen=True)
class _GraphJob:
    """What the graph's tasks share: the fields read, the pairs and (pass 2) the nodes."""

    schema: Schema
    fields: tuple[str, ...]
    read: tuple[FeatureSpec, ...]
    batch_rows: int
    pairs: tuple[tuple[str, str], ...]
    vocab: dict[str, list[str]] | None = None

    def batches(self, part: ShardPart) -> Iterator[pa.RecordBatch]:
        rows = (part.first_row, part.first_row + part.rows)
        return iter_record_batches(
            self.schema, [Path(part.path)], self.read, self.batch_rows, row_range=rows
        )


def values_task(part: ShardPart, job: _GraphJob) -> tuple[dict[str, pa.Table], int, float, int]:
    """Pass 1 over one part of the files. A task function."""
    return count_values(job.schema, job.batches(part), job.fields)


def pair_keys_task(part: ShardPart, job: _GraphJob) -> tuple[list[pa.Table], dict[str, int]]:
    """Pass 2 over one part of the files (partial keyed counts). A task function."""
    return count_pair_keys(job.schema, job.batches(part), job.pairs, job.vocab or {})


def _merge_values(
    parts: Sequence[tuple[dict[str, pa.Table], int, float, int]], fields: Sequence[str]
) -> tuple[dict[str, pa.Table], int, float, int]:
    """Pass 1's parts added up, in part order."""
    counts = {}
    for f in fields:
        tables = [p[0][f] for p in parts if p[0][f].num_rows]
        counts[f] = (
            _merge(tables, "value", ["count"])
            if tables
            else pa.table({"value": pa.array([], pa.string()), "count": pa.array([], pa.int64())})
        )
    return (
        counts,
        sum(p[1] for p in parts),
        sum(p[2] for p in parts),
        sum(p[3] for p in parts),
    )


def _relations(
    pairs: Sequence[tuple[str, str]], tables: Sequence[pa.Table], min_impressions: int
) -> tuple[list[Relation], dict[str, int]]:
    """The relations of the counted pair tables, edges under ``min_impressions`` dropped (and
    counted per relation)."""
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
    return relations, dropped


def _check_limits(
    min_count: object, max_nodes: object, alpha: object, min_impressions: object
) -> None:
    """``build_graph``'s limits, each checked with a ``ValueError`` naming it."""
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
    if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes < 1):
        raise ValueError(f"max_nodes must be None or an integer >= 1, got {max_nodes!r}")
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if not isinstance(min_impressions, int) or min_impressions < 1:
        raise ValueError(f"min_impressions must be an integer >= 1, got {min_impressions!r}")


def _pair_tables(
    keyed: list[tuple[list[pa.Table], dict[str, int]]],
    pairs: Sequence[tuple[str, str]],
    sizes: dict[str, int],
) -> tuple[list[pa.Table], dict[str, int]]:
    """The second pass's part results merged: (each pair's edge table, each relation's edges
    with a missing side)."""
    tables = [
        _uv_table(_merge_keys([k[0][r] for k in keyed if k[0][r].num_rows]), sizes[b])
        for r, (_, b) in enumerate(pairs)
    ]
    skipped = {relation_name(p): sum(k[1][relation_name(p)] for k in keyed) for p in pairs}
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
    runner: TaskRunner | None = None,
) -> PairGraph:
    """Builds the PCF-GNN graph of ``pairs`` from Parquet ``files`` (two streaming passes, each
    a job of tasks over parts of the files on ``runner``, default this process: the counts of
    the parts add up to the same graph on every runner).

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
    _check_limits(min_count, max_nodes, alpha, min_impressions)
    log = log or (lambda _: None)
    fields = list(dict.fromkeys(f for p in pairs for f in p))
    specs = [schema.field(f) for f in fields]
    read = [*specs, schema.label]

    runner = runner_or_local(runner)
    parts = shard_parts(files)
    job = _GraphJob(schema, tuple(fields), tuple(read), batch_rows, tuple(pairs))
    t0 = time.time()
    counts, rows, clicks, missing = _merge_values(
        runner.map(values_task, parts, shared=job, label="pcf graph: count values"), fields
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
    job = dataclasses.replace(job, vocab=vocab)
    keyed = runner.map(pair_keys_task, parts, shared=job, label="pcf graph: count pairs")
    tables, skipped = _pair_tables(keyed, pairs, {f: len(v) + 1 for f, v in vocab.items()})
    relations, dropped = _relations(pairs, tables, min_impressions)
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
