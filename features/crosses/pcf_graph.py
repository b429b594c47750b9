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

``features.crosses.pcf_build.build_graph`` reads validated record batches (``features.dataset.iter_record_batches``) twice:
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.json_files import read_json_object
from features.read_report import DataError

GRAPH_FILE = "graph.json"
_GRAPH_WHAT = "the pair graph `stitchrec crosses pcf-gnn` writes"

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
        return vocab_ids(values, pa.array(self.vocab[field], pa.string()))

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
        meta = read_json_object(d / GRAPH_FILE, _GRAPH_WHAT)
        try:
            return cls._read(d, meta)
        except (KeyError, IndexError, TypeError, ValueError, OSError, pa.ArrowException) as e:
            raise DataError(
                f"PCF-GNN pair graph {str(d)!r} cannot be read ({type(e).__name__}: {e}): "
                f"expected {_GRAPH_WHAT}"
            ) from None

    @classmethod
    def _read(cls, d: Path, meta: dict[str, Any]) -> PairGraph:
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


def value_strings(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as strings with missing cells as null (int64 -1 is missing, as in the data)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_integer(col.type):
        col = pc.if_else(pc.equal(col, -1), pa.scalar(None, col.type), col)
    col = pc.cast(col, pa.string())
    return pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.string()), col)


def vocab_ids(values: pa.Array | pa.ChunkedArray, vocab: pa.Array) -> np.ndarray:
    """Local ids of ``values`` in ``vocab``: 1 + its index, 0 (OOV) when not in it, -1 missing."""
    s = value_strings(values)
    idx = pc.index_in(s, value_set=vocab)
    ids = pc.fill_null(pc.add(idx, 1), 0).to_numpy(zero_copy_only=False).astype(np.int32)
    ids[pc.is_null(s).to_numpy(zero_copy_only=False)] = -1
    return ids
