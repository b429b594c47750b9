"""Side tables (the schema's joins) and the read plan of one data file: which source columns
come from the file and which from a side table joined on a key column.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from features.cells import as_plain
from features.csv_format import read_header, string_convert_options, unique_columns
from features.read_report import DataError, short_list
from features.schema import Schema

# --------------------------------------------------------------------------------------------
# Side tables (joins)


@dataclasses.dataclass
class SideTable:
    path: Path
    on: str
    columns: list[str]  # the columns this join may provide
    key: pa.Array  # string keys, one per side-table row
    table: pa.Table  # all columns as strings


def _load_side_table(join: Any, data_file: Path, cache: dict[Any, SideTable]) -> SideTable:
    """Reads a join's side table (resolved next to ``data_file``) whole, as strings; cached."""
    path = (data_file.parent / join.path).resolve()
    cache_key = (path, join.on, join.delimiter, join.columns)
    if cache_key in cache:
        return cache[cache_key]
    where = f"side table {str(path)!r} (joined on {join.on!r} to {str(data_file)!r})"
    if not path.is_file():
        raise DataError(f"{where} does not exist")
    header = unique_columns(read_header(path, join.delimiter), path)
    for needed, what in (
        (join.on, "the join key"),
        *((c, "a listed column") for c in join.columns or ()),
    ):
        if needed not in header:
            raise DataError(
                f"{where} lacks {what} {needed!r}; its columns are {short_list(header)}"
            )
    try:
        table = pacsv.read_csv(
            pa.input_stream(str(path), compression="detect"),
            parse_options=pacsv.ParseOptions(delimiter=join.delimiter, newlines_in_values=True),
            convert_options=string_convert_options(header),
        )
    except pa.ArrowException as e:
        raise DataError(f"{where} could not be read: {e}") from None
    provides = [c for c in (join.columns or header) if c != join.on]
    key = pc.cast(table[join.on].combine_chunks(), pa.string())
    side = SideTable(path, join.on, provides, key, table)
    cache[cache_key] = side
    return side


@dataclasses.dataclass
class ReadPlan:
    """Where each source column of one data file comes from."""

    read: list[str]  # columns read from the data file (needed columns and join keys)
    joins: list[tuple[SideTable, list[str]]]  # side table and the columns taken from it
    notes: dict[str, str]  # column -> " (from side.csv on key)" for messages


def plan_file(
    schema: Schema, file: Path, file_cols: list[str], cache: dict[Any, SideTable]
) -> ReadPlan:
    """Matches the schema's source columns to the file's columns and its join side tables."""
    needed = list(dict.fromkeys(f.column for f in schema.fields))
    read = [c for c in needed if c in file_cols]
    missing = [c for c in needed if c not in file_cols]
    joins: list[tuple[SideTable, list[str]]] = []
    notes: dict[str, str] = {}
    for join in schema.source.joins:
        side = _load_side_table(join, file, cache)
        take = [c for c in missing if c in side.columns]
        if not take:
            continue
        if join.on not in file_cols:
            raise DataError(
                f"file {str(file)!r} lacks the join key column {join.on!r} needed to join "
                f"{str(side.path)!r}; the file's columns are {short_list(file_cols)}"
            )
        joins.append((side, take))
        missing = [c for c in missing if c not in take]
        notes.update({c: f" (from {side.path.name} joined on {join.on!r})" for c in take})
        read += [join.on] if join.on not in read else []
    if missing:
        sides = f" or in its join side tables {[str(j.path) for j in schema.source.joins]}"
        raise DataError(
            f"file {str(file)!r} lacks column(s) {short_list(missing)} that schema {schema.name!r} reads"
            f"{sides if schema.source.joins else ''}; the file's columns are {short_list(file_cols)}"
        )
    return ReadPlan(read, joins, notes)


def apply_joins(cols: dict[str, pa.Array], plan: ReadPlan) -> dict[str, pa.Array]:
    """Adds the side-table columns to ``cols``, row-aligned; unmatched keys give nulls."""
    for side, take in plan.joins:
        key = pc.cast(as_plain(cols[side.on]), pa.string())
        idx = pc.index_in(key, value_set=side.key)
        for c in take:
            cols[c] = side.table[c].combine_chunks().take(idx)
    return cols
