"""Vocabularies that grow and age over daily windows, with stable ids.

``VocabState`` keeps, per field with its own vocabulary (``vocab = "vocabulary"``, categorical,
multi-categorical or an unshared sequence), a table of every value it has counted::

    value (string) | count (float64, decayed) | last_seen (int64 window) | id (int64, 0: none)

Window ``w`` (``VocabState.advance``) updates it from that window's full value counts
``n_w(v)`` (``compute_stats(..., all_counts=True)``):

* decay: ``c_w(v) = decay * c_{w-1}(v) + n_w(v)``; ``last_seen = w`` where ``n_w(v) > 0``;
* eviction by age: with ``evict_after = k > 0``, a value with ``w - last_seen > k`` is evicted
  and forgotten (its row leaves the table);
* admission: the vocabulary is the remaining values with ``c_w(v) >= min_count`` (the schema's,
  compared with the decayed count), kept or new alike;
* cap: past the schema's ``max_vocab``, the coldest are evicted first: lowest count, then
  oldest ``last_seen``, then value (ascending);
* stable ids: a kept value keeps its id; new values, most counted first (ties by value), take
  the freed ids lowest first, then ``V_old + 1, V_old + 2, ...``; when freed ids outnumber the
  new values, the values whose ids exceed the new size ``V`` move, in id order, into the
  remaining holes, lowest first, so ids stay ``1..V`` (``VocabChange`` counts them as moved).

Shared sequences read their target's vocabulary and hashed fields have none: neither has state.
``VocabState.stats(base)`` gives ``DatasetStats`` whose vocabularies are the state's in id order,
so ``features.preprocessing`` maps value ``v`` to its state id (``vocab[id - 1] = v``).
``save(stats_dir)`` writes ``stats_dir/vocab_state/<field>.parquet`` and ``state.json``
(``{"window": w, "options": {...}, "fields": {field: file}}``), ``state.json`` last.
All per-value work is Arrow joins and sorts and NumPy arithmetic, never a loop per value.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.json_files import read_json_object
from features.read_report import DataError
from features.schema import VALUE_KINDS, FeatureSpec, Schema, SchemaError

if TYPE_CHECKING:  # annotations only: features.stats pulls in pandas, which config users skip
    from features.stats import DatasetStats

STATE_DIR = "vocab_state"
STATE_FILE = "state.json"
_STATE_WHAT = "the vocabulary state `stitchrec train` writes for a run with a [vocab] section"
_COLUMNS = pa.schema(
    [("value", pa.string()), ("count", pa.float64()), ("last_seen", pa.int64()), ("id", pa.int64())]
)
_EPS = 1e-9  # decayed counts compare with min_count up to float rounding
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class VocabOptions:
    """How vocabularies age across windows.

    Attributes:
      decay: earlier windows' counts are multiplied by ``decay`` once per window
        (``0 < decay <= 1``; 1: counts add up forever).
      evict_after: a value unseen for more than this many windows is evicted (0: never).
    """

    decay: float = 1.0
    evict_after: int = 0

    def __post_init__(self) -> None:
        d = self.decay
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 < d <= 1:
            raise ValueError(f"VocabOptions decay = {d!r}: expected a number in (0, 1]")
        k = self.evict_after
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(
                f"VocabOptions evict_after = {k!r}: expected an integer >= 0 (windows; 0: never)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FieldChange:
    """One field's vocabulary change: values ``kept`` (in both; ``moved`` of them changed id),
    ``added``, ``evicted``, and the new ``size`` V (ids 1..V)."""

    kept: int
    added: int
    evicted: int
    moved: int
    size: int


@dataclasses.dataclass(frozen=True)
class VocabChange:
    """What ``VocabState.advance`` did to each vocabulary field in ``window``."""

    window: int
    fields: dict[str, FieldChange]

    def __getitem__(self, name: str) -> FieldChange:
        return self.fields[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "fields": {n: dataclasses.asdict(c) for n, c in self.fields.items()},
        }


def vocab_fields(schema: Schema) -> list[FeatureSpec]:
    """The model inputs with their own vocabulary: the fields a ``VocabState`` keeps."""
    return [
        s
        for s in schema.model_inputs
        if s.kind in VALUE_KINDS and s.vocab == "vocabulary" and s.shares_embedding_with is None
    ]


class VocabState:
    """Per-field value tables (columns ``value, count, last_seen, id``) at window ``window``,
    aged under ``options``. Rows in the vocabulary come first, by id."""

    def __init__(self, tables: dict[str, pa.Table], window: int, options: VocabOptions):
        for name, t in tables.items():
            _check_table(t, f"vocabulary state of {name!r}")
        self.tables = dict(tables)
        self.window = int(window)
        self.options = options

    @property
    def fields(self) -> list[str]:
        return list(self.tables)

    def vocab(self, name: str) -> list[str]:
        """Field ``name``'s vocabulary in id order: ``vocab[id - 1]`` holds ``id``."""
        t = self.tables[name]
        return t.column("value").slice(0, self.size(name)).to_pylist()

    def size(self, name: str) -> int:
        """V: the ids of field ``name`` are ``1..V``."""
        return int(pc.sum(pc.greater(self.tables[name].column("id"), 0)).as_py() or 0)

    @classmethod
    def first(cls, stats: DatasetStats, schema: Schema, options: VocabOptions) -> VocabState:
        """Window 0 from a run's statistics: its vocabulary ids (value ``vocab[i]``: id
        ``i + 1``) and counts (every value's where ``all_counts`` was kept, else the
        vocabulary's: values outside it count 0)."""
        tables = {}
        for spec in vocab_fields(schema):
            fs = stats[spec.name]
            vocab = pa.array(fs.vocab, pa.string())
            values, counts = _window_counts(fs)
            ids = _positions(values, vocab) + 1  # 0: outside the vocabulary
            t = _table(values, counts.astype(np.float64), np.zeros(len(values), np.int64), ids)
            tables[spec.name] = _sorted(t)
        return cls(tables, 0, options)

    def advance(
        self, window_stats: DatasetStats, schema: Schema, options: VocabOptions
    ) -> tuple[VocabState, VocabChange]:
        """The state after the next window, whose full counts ``window_stats`` holds
        (``compute_stats(..., all_counts=True)``), and what changed per field."""
        specs = vocab_fields(schema)
        names = [s.name for s in specs]
        if sorted(names) != sorted(self.tables):
            raise SchemaError(
                f"vocabulary state (window {self.window}) has fields {sorted(self.tables)}, the "
                f"schema's vocabulary fields are {sorted(names)}: expected the same fields"
            )
        window = self.window + 1
        tables, changes = {}, {}
        for spec in specs:
            fs = window_stats[spec.name]
            if fs.all_counts is None:
                raise ValueError(
                    f"window statistics of field {spec.name!r} lack every value's count: "
                    "expected compute_stats(..., all_counts=True)"
                )
            tables[spec.name], changes[spec.name] = _advance_field(
                self.tables[spec.name], fs.all_counts, window, spec, options
            )
        return VocabState(tables, window, options), VocabChange(window, changes)

    def stats(self, base: DatasetStats) -> DatasetStats:
        """A copy of ``base`` (the window's statistics) whose vocabulary fields have the state's
        vocabulary in id order, its decayed counts rounded (at least 1) and ``oov_count`` the
        window's cells outside it; every other statistic is ``base``'s own."""
        fields = {n: dataclasses.replace(fs) for n, fs in base.fields.items()}
        for name, t in self.tables.items():
            if name not in fields:
                raise ValueError(
                    f"statistics lack vocabulary field {name!r}; they have {sorted(fields)}"
                )
            fs, size = fields[name], self.size(name)
            vocab = t.column("value").slice(0, size)
            decayed = t.column("count").slice(0, size).to_numpy()
            values, counts = _window_counts(base.fields[name])
            at = _positions(vocab, values)
            in_vocab = int(counts[at[at >= 0]].sum())
            fs.vocab = vocab.to_pylist()
            fs.vocab_counts = np.maximum(np.floor(decayed + 0.5), 1).astype(np.int64).tolist()
            fs.oov_count = fs.count - in_vocab
        return dataclasses.replace(base, fields=fields)

    @staticmethod
    def exists(stats_dir: str | Path) -> bool:
        """Whether ``stats_dir`` holds a complete saved state."""
        return (Path(stats_dir) / STATE_DIR / STATE_FILE).is_file()

    def save(self, stats_dir: str | Path) -> Path:
        """Writes ``stats_dir/vocab_state/``: one Parquet file per field, then ``state.json``
        (an earlier ``state.json`` is removed first, so a cut-short write reads as absent)."""
        d = Path(stats_dir) / STATE_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / STATE_FILE).unlink(missing_ok=True)
        files = {}
        for i, (name, t) in enumerate(self.tables.items()):
            files[name] = f"{name}.parquet" if _SAFE_NAME.fullmatch(name) else f"{i:03d}.parquet"
            pq.write_table(t, d / files[name])
        raw = {"window": self.window, "options": self.options.to_dict(), "fields": files}
        tmp = d / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(raw, indent=1))
        tmp.replace(d / STATE_FILE)
        return d

    @classmethod
    def load(cls, stats_dir: str | Path) -> VocabState:
        """The state ``save`` wrote under ``stats_dir``.

        Raises:
          FileNotFoundError: no ``state.json`` there.
          DataError: ``state.json`` or a field's table cannot be read as what ``save`` writes
            (the message names the file and what is wrong).
        """
        d = Path(stats_dir) / STATE_DIR
        path = d / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no vocabulary state in {str(d)!r} ({STATE_FILE} missing)")
        raw = read_json_object(path, _STATE_WHAT)
        fields, window = raw.get("fields"), raw.get("window")
        if not isinstance(fields, dict) or isinstance(window, bool) or not isinstance(window, int):
            raise DataError(
                f"{str(path)!r} has no fields object and window number: expected {_STATE_WHAT}"
            )
        try:
            options = VocabOptions(**raw.get("options", {}))
        except (TypeError, ValueError) as e:
            raise DataError(f"{str(path)!r}: options: {e}: expected {_STATE_WHAT}") from None
        tables = {}
        for name, file in fields.items():
            where = repr(str(d / str(file)))
            try:
                tables[name] = pq.read_table(d / str(file))
            except (OSError, pa.ArrowException) as e:
                raise DataError(f"{where} (field {name!r}) cannot be read: {e}") from None
            _check_table(tables[name], where)
        return cls(tables, window, options)


def _check_table(t: pa.Table, where: str) -> None:
    """Raises DataError unless ``t`` has the state's columns and its first rows hold ids 1..V."""
    if not t.schema.equals(_COLUMNS):
        got = ", ".join(f"{f.name} {f.type}" for f in t.schema)
        want = ", ".join(f"{f.name} {f.type}" for f in _COLUMNS)
        raise DataError(f"{where}: columns {got}; expected {want}")
    ids = t.column("id").to_numpy()
    size = int((ids > 0).sum())
    if not np.array_equal(ids[:size], np.arange(1, size + 1)):
        raise DataError(f"{where}: the first {size} rows must hold ids 1..{size} in order")


def _table(values: pa.Array, count: np.ndarray, last: np.ndarray, ids: np.ndarray) -> pa.Table:
    return pa.Table.from_arrays(
        [values, pa.array(count, pa.float64()), pa.array(last), pa.array(ids)], schema=_COLUMNS
    )


def _sorted(t: pa.Table) -> pa.Table:
    """Vocabulary rows by id, then the others by count (descending), then value."""
    ids = t.column("id").to_numpy()
    key = np.where(ids > 0, ids, ids.max(initial=0) + 1)
    keyed = t.append_column("_key", pa.array(key))
    order = pc.sort_indices(
        keyed, sort_keys=[("_key", "ascending"), ("count", "descending"), ("value", "ascending")]
    )
    return t.take(order)


def _positions(values: Any, value_set: pa.Array) -> np.ndarray:
    """The int64 position of each of ``values`` in ``value_set`` (-1: not in it)."""
    at = pc.fill_null(pc.index_in(values, value_set=value_set), -1)
    return at.to_numpy(zero_copy_only=False).astype(np.int64)


def _window_counts(fs: Any) -> tuple[pa.Array, np.ndarray]:
    """(values, int64 counts) of a field's statistics: ``all_counts``, else the vocabulary's."""
    if fs.all_counts is not None:
        t = fs.all_counts
        values = pc.cast(t.column("value"), pa.string()).combine_chunks()
        return values, t.column("count").to_numpy().astype(np.int64)
    return pa.array(fs.vocab, pa.string()), np.asarray(fs.vocab_counts, np.int64)


def _order(t: pa.Table, rows: np.ndarray, keys: list[tuple[str, str]]) -> np.ndarray:
    """``rows`` (indices into ``t``) sorted by ``keys``."""
    sub = t.take(pa.array(rows, pa.int64()))
    return rows[pc.sort_indices(sub, sort_keys=keys).to_numpy()]


def _merge(old: pa.Table, window_counts: pa.Table, decay: float) -> pa.Table:
    """Old rows joined with the window's counts: value, count (decayed + window), last_seen
    (-1 for new values), id (0 for new values), n (the window's count)."""
    win = pa.table(
        {
            "value": pc.cast(window_counts.column("value"), pa.string()),
            "n": pc.cast(window_counts.column("count"), pa.int64()),
        }
    )
    j = old.join(win, keys="value", join_type="full outer", coalesce_keys=True)
    n = pc.fill_null(j.column("n"), 0).to_numpy()
    count = decay * pc.fill_null(j.column("count"), 0.0).to_numpy() + n
    return pa.table(
        {
            "value": j.column("value"),
            "count": pa.array(count, pa.float64()),
            "last_seen": pc.fill_null(j.column("last_seen"), -1),
            "id": pc.fill_null(j.column("id"), 0),
            "n": pa.array(n, pa.int64()),
        }
    )


def _advance_field(
    old: pa.Table, window_counts: pa.Table, window: int, spec: FeatureSpec, options: VocabOptions
) -> tuple[pa.Table, FieldChange]:
    """One field's table after ``window`` (see the module docstring for the rules)."""
    j = _merge(old, window_counts, options.decay)
    count = j.column("count").to_numpy()
    last = np.where(j.column("n").to_numpy() > 0, window, j.column("last_seen").to_numpy())
    old_id = j.column("id").to_numpy()
    alive = np.ones(len(count), bool)
    if options.evict_after:
        alive = window - last <= options.evict_after
    j = j.set_column(2, "last_seen", pa.array(last, pa.int64()))
    member = alive & (count + _EPS >= spec.min_count)
    if spec.max_vocab is not None and member.sum() > spec.max_vocab:
        hot = [("count", "descending"), ("last_seen", "descending"), ("value", "descending")]
        rows = _order(j, np.flatnonzero(member), hot)
        member[:] = False
        member[rows[: spec.max_vocab]] = True
    kept, was = member & (old_id > 0), int((old_id > 0).sum())
    new_rows = _order(
        j, np.flatnonzero(member & (old_id == 0)), [("count", "descending"), ("value", "ascending")]
    )
    size = int(kept.sum()) + len(new_rows)
    free = np.ones(was + 1, bool)
    free[0] = False
    free[old_id[kept]] = False
    holes = np.flatnonzero(free)
    ids = np.where(kept, old_id, 0)
    ids[new_rows] = np.concatenate([holes, np.arange(was + 1, was + 1 + len(new_rows))])[
        : len(new_rows)
    ]
    left = holes[len(new_rows) :]
    left = left[left <= size]
    high = np.flatnonzero(ids > size)
    movers = high[np.argsort(ids[high])]
    ids[movers] = left
    j = j.set_column(3, "id", pa.array(ids, pa.int64()))
    change = FieldChange(
        kept=int(kept.sum()),
        added=len(new_rows),
        evicted=was - int(kept.sum()),
        moved=len(movers),
        size=size,
    )
    keep_rows = pa.array(alive)
    return _sorted(j.drop_columns(["n"]).filter(keep_rows)), change
