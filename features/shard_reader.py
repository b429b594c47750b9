"""Validated reads of Parquet shards, with no TensorFlow: the fields a model reads, their numpy
form (missing cells filled), validated record batches of a row range, and the batches of an
epoch in their ``(seed, epoch)`` order (``features.dataset`` turns them into a tf.data input).

Missing cells are filled explicitly, never as NaN: ``""`` for strings (the OOV/missing row),
``-1`` for int64 categoricals (also the OOV row), ``field.default`` for numeric fields.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.cells import is_list_type, join_sequence, row_errors
from features.columns import filled_column
from features.completion import check_complete
from features.file_batches import check_scalar_columns
from features.read_report import DataError, not_parquet
from features.schema import FeatureKind, FeatureSpec, Schema


def input_fields(schema: Schema, with_label: bool = True) -> list[FeatureSpec]:
    """Model inputs in schema order, then every label (the primary label first)."""
    fields = list(schema.model_inputs)
    return [*fields, *schema.labels] if with_label else fields


def list_parquet(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Parquet files under ``paths`` (files, directories or glob patterns), sorted.

    Raises DataError for files in an unfinished conversion (``features.completion``)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(p.glob("*.parquet")))
        elif p.exists():
            out.append(p)
        else:
            matches = [Path(m) for m in sorted(glob.glob(str(p)))]
            out.extend(m for m in matches if m.suffix == ".parquet")
    if not out:
        raise FileNotFoundError(f"no Parquet files found under {[str(p) for p in paths]}")
    check_complete(p.parent for p in out)
    return out


def column_to_numpy(column: pa.ChunkedArray | pa.Array, spec: FeatureSpec) -> np.ndarray:
    """An Arrow column as a numpy array with missing cells filled (``features.columns``)."""
    column = filled_column(column, spec)
    if spec.kind in (FeatureKind.NUMERIC, FeatureKind.LABEL):
        return column.to_numpy().astype(np.float32, copy=False)
    if spec.dtype == "int64":
        return column.to_numpy()
    return column.to_numpy(zero_copy_only=False).astype(object)


def table_to_numpy(
    table: pa.Table | pa.RecordBatch, fields: Sequence[FeatureSpec]
) -> dict[str, np.ndarray]:
    """``{field: numpy array}`` for ``fields``, missing cells filled (see the module docstring)."""
    return {f.name: column_to_numpy(table.column(f.name), f) for f in fields}


def _arrow_target(spec: FeatureSpec) -> tuple[pa.DataType, str]:
    """The Arrow type ``column_to_numpy`` casts a field's column to, and what a cell must be."""
    if spec.kind in (FeatureKind.NUMERIC, FeatureKind.LABEL):
        if spec.kind == FeatureKind.LABEL:
            return pa.float32(), "0 or 1"
        return pa.float32(), "a finite number or an empty cell"
    if spec.dtype == "int64":
        return pa.int64(), "an integer (int64) or an empty cell"
    return pa.string(), "text or an empty cell"


def _cell_error(path: Path, row: int, spec: FeatureSpec, value: object, expected: str) -> str:
    return f"{path}: row {row}, column {spec.name!r}: value {value!r}, expected {expected}"


def _check_types(
    rb: pa.RecordBatch, fields: Sequence[FeatureSpec], path: Path, first_row: int
) -> None:
    """Every column must cast to its field's type (``column_to_numpy``): a cell that does not
    (text in a numeric column, 1.5 in an int64 one) raises DataError naming row and column."""
    for f in fields:
        col = rb.column(f.name)
        target, expected = _arrow_target(f)
        if col.type == target or (f.kind == FeatureKind.SEQUENCE and is_list_type(col.type)):
            continue
        try:
            pc.cast(col, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            i = next((i for i in range(len(col)) if not _casts(col.slice(i, 1), target)), 0)
            raise DataError(
                _cell_error(path, first_row + i + 1, f, col[i].as_py(), expected)
            ) from None


def _casts(arr: pa.Array, target: pa.DataType) -> bool:
    try:
        pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _check_batch(
    rb: pa.RecordBatch, fields: Sequence[FeatureSpec], path: Path, first_row: int
) -> None:
    """Cells must cast to their field's type; labels must be 0/1 and present (a ``defined_on``
    label may be missing where its parent is 0); numeric cells finite or missing (never
    NaN/Inf); the rules across fields of ``features.cells`` hold."""
    _check_types(rb, fields, path, first_row)
    for f in fields:
        col = rb.column(f.name)
        if f.kind == FeatureKind.LABEL:
            values = pc.cast(col, pa.float64())
            ok = pc.fill_null(pc.or_(pc.equal(values, 0.0), pc.equal(values, 1.0)), False)
            expected = "0 or 1"
            if f.defined_on is not None and f.defined_on in rb.schema.names:
                parent_zero = pc.equal(pc.cast(rb.column(f.defined_on), pa.float64()), 0.0)
                ok = pc.or_(ok, pc.fill_null(pc.and_(pc.is_null(values), parent_zero), False))
                expected = (
                    f"0 or 1, missing only where {f.defined_on!r} is 0 (label {f.name!r} is "
                    f"defined_on {f.defined_on!r})"
                )
        elif f.kind == FeatureKind.SEQUENCE and is_list_type(col.type):
            ok = pa.array(~join_sequence(col, f.separator)[1])
            expected = f"a list of non-empty texts without {f.separator!r}"
        elif f.kind == FeatureKind.NUMERIC and pa.types.is_floating(col.type):
            ok = pc.fill_null(pc.is_finite(col), True)
            expected = "a finite number or an empty cell"
        else:
            continue
        if not pc.all(ok).as_py():
            i = pc.index(ok, False).as_py()
            raise DataError(_cell_error(path, first_row + i + 1, f, col[i].as_py(), expected))
    _check_rows(rb, fields, path, first_row)


def _check_rows(
    rb: pa.RecordBatch, fields: Sequence[FeatureSpec], path: Path, first_row: int
) -> None:
    """The rules across fields (``features.cells.row_errors``) among the fields read."""
    names = {f.name for f in fields}
    specs = [f for f in fields if f.kind in (FeatureKind.SEQUENCE, FeatureKind.LABEL)]
    if not any((f.aligned_with or f.defined_on) in names for f in specs):
        return
    values = {}
    for f in specs:
        col = rb.column(f.name)
        if f.kind == FeatureKind.SEQUENCE:
            col = join_sequence(col, f.separator)[0] if is_list_type(col.type) else col
            values[f.name] = pc.cast(col, pa.string())
        else:
            values[f.name] = pc.cast(col, pa.float32())
    errors = row_errors(specs, values, np.zeros(rb.num_rows, dtype=bool))
    if errors:
        i = min(errors)
        raise DataError(f"{path}: row {first_row + i + 1}, {errors[i]}")


def _check_schema(pf: pq.ParquetFile, schema: Schema, columns: list[str], path: Path) -> None:
    """Every column is present and holds one value per row (no list, struct or map)."""
    names = pf.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(
            f"{path}: Parquet file lacks columns {missing} that schema {schema.name!r} needs; "
            f"it has {names}"
        )
    check_scalar_columns(path, pf.schema_arrow, columns, {f.name for f in schema.sequences})


def _open_parquet(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise not_parquet(path, e) from None


def iter_record_batches(
    schema: Schema,
    files: Sequence[Path],
    fields: Sequence[FeatureSpec] | None = None,
    batch_rows: int = 65_536,
    row_range: tuple[int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Validated record batches of ``fields`` (default: model inputs and label) from Parquet.

    ``row_range=(lo, hi)`` keeps rows ``lo <= r < hi`` of the concatenation of ``files`` (in the
    order given): files and row groups outside the range are skipped from their footers, unread.

    Raises ``DataError`` naming the file, row and column for a missing or nested (list) column
    (a list of scalars is allowed for a sequence field), a cell that does not cast to its
    field's type, a label that is not 0/1, a NaN or infinite numeric value, a row breaking a
    rule across fields (``features.cells.row_errors``), or a file that is not readable
    Parquet. Bad rows are never skipped here:
    ``[data] max_bad_rows`` reads Parquet inputs through ``features.shards.convert`` instead.
    """
    fields = list(fields) if fields is not None else input_fields(schema)
    columns = [f.name for f in fields]
    lo, hi = row_range if row_range is not None else (0, None)
    offset = 0  # row of the concatenation where the current file starts
    for path in files:
        if hi is not None and offset >= hi:
            return
        pf = _open_parquet(path)
        rows = pf.metadata.num_rows
        if row_range is not None and offset + rows <= lo:
            offset += rows
            continue
        _check_schema(pf, schema, columns, path)
        start = 0  # row of this file where the current row group starts
        for group in range(pf.num_row_groups):
            group_rows = pf.metadata.row_group(group).num_rows
            first, start = start, start + group_rows
            if offset + start <= lo or (hi is not None and offset + first >= hi):
                continue  # the row group lies outside the range
            row = first
            for rb in pf.iter_batches(batch_size=batch_rows, columns=columns, row_groups=[group]):
                a = max(lo - offset - row, 0)
                b = rb.num_rows if hi is None else min(hi - offset - row, rb.num_rows)
                if b > a:
                    part = rb if (a, b) == (0, rb.num_rows) else rb.slice(a, b - a)
                    _check_batch(part, fields, path, row + a)
                    yield part
                row += rb.num_rows
        offset += rows


def shard_range(total_rows: int, index: int, count: int) -> tuple[int, int]:
    """Rows ``[index * q, (index + 1) * q)`` with ``q = total_rows // count``: equal, disjoint
    ranges for ``count`` workers (the last ``total_rows % count`` rows go to nobody)."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in [0, {count})")
    per = total_rows // count
    return index * per, (index + 1) * per


def iter_batches(
    schema: Schema,
    files: Sequence[Path],
    *,
    batch_size: int,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
    skip_batches: int = 0,
    shuffle_buffer: int = 262_144,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yields dicts of numpy arrays (the same content as ``make_dataset``'s elements)."""
    fields = input_fields(schema)
    rng = np.random.default_rng([seed, epoch])
    order = list(files)
    if shuffle:
        order = [order[i] for i in rng.permutation(len(order))]
    row_range = None
    if shard is not None:  # the same file order on every worker, then each its own rows
        row_range = shard_range(count_rows(order), *shard)
        rng = np.random.default_rng([seed, epoch, *shard])
    buffer_rows = max(shuffle_buffer, batch_size) if shuffle else batch_size
    pending: list[pa.Table] = []
    pending_rows = 0
    emitted = 0

    def emit(table: pa.Table) -> Iterator[dict[str, np.ndarray]]:
        nonlocal emitted
        if shuffle:
            table = table.take(pa.array(rng.permutation(table.num_rows)))
        for start in range(0, table.num_rows, batch_size):
            part = table.slice(start, batch_size)
            if part.num_rows < batch_size and drop_remainder:
                return
            emitted += 1
            if emitted <= skip_batches:
                continue
            yield table_to_numpy(part, fields)

    for rb in iter_record_batches(schema, order, fields, row_range=row_range):
        pending.append(pa.Table.from_batches([rb]))
        pending_rows += rb.num_rows
        if pending_rows >= buffer_rows:
            table = pa.concat_tables(pending)
            full = (table.num_rows // batch_size) * batch_size
            yield from emit(table.slice(0, full))
            pending = [table.slice(full)]
            pending_rows = table.num_rows - full
    if pending_rows:
        yield from emit(pa.concat_tables(pending))


def count_rows(paths: str | Path | Sequence[str | Path]) -> int:
    """Rows in Parquet shards, from their footers."""
    return sum(_open_parquet(p).metadata.num_rows for p in list_parquet(paths))
