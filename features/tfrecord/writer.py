"""``TFRecordShardWriter``: Arrow record batches -> TFRecord shards of block Examples plus their
manifest (``features.tfrecord.encode``, ``features.tfrecord.manifest``); no TensorFlow.

The interface of ``features.shards.ShardWriter``: ``write(batch)``, ``close() -> paths``,
``abort()``. Files are ``{prefix}-00000.tfrecord``, ... of ``rows_per_shard`` rows each (the
last fewer), written under a hidden temporary name and renamed when complete; the manifest
``{prefix}.tfrecord.json`` is written by ``close``, last, so readers see the files only once
every one is complete. Creating the writer removes an earlier run's files and manifest of the
same prefix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from features.read_report import DataError
from features.schema import Schema
from features.shard_reader import input_fields
from features.tfrecord.encode import EncodedColumn, encode_columns, example, frame, list_type
from features.tfrecord.manifest import (
    MANIFEST_SUFFIX,
    SUFFIX,
    TFRecordFile,
    manifest_path,
    write_manifest,
)

#: rows per record: a record is parsed whole, so ~1k rows make the per-record cost vanish
#: while the padding of a file's last block stays small
BLOCK_ROWS = 1024
#: rows held before they are encoded together (a few hundred KiB per column)
_FLUSH_ROWS = 65_536


class TFRecordShardWriter:
    """Writes record batches to ``out_dir/{prefix}-00000.tfrecord``, ... (see the module
    docstring).

    Args:
      out_dir: the folder (created).
      rows_per_shard: rows per file (the last file fewer), an integer >= 1.
      prefix: file name prefix; writers of different prefixes may share a folder.
      schema: the schema of the batches' columns (``Schema.as_parquet()`` of the raw schema);
        its model inputs and labels are written.
      block_rows: rows per record (``BLOCK_ROWS``).
      first_index: the number of the first file (``{prefix}-{first_index:05d}.tfrecord``).
      clean: remove an earlier run's files and manifest of ``prefix`` first (a task writing
        one file of a job's shards leaves the others).
    """

    def __init__(
        self,
        out_dir: str | Path,
        rows_per_shard: int,
        prefix: str = "part",
        *,
        schema: Schema,
        block_rows: int = BLOCK_ROWS,
        first_index: int = 0,
        clean: bool = True,
    ) -> None:
        for key, value in (("rows_per_shard", rows_per_shard), ("block_rows", block_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stale = re.compile(rf"^{re.escape(prefix)}(-\d+{re.escape(SUFFIX)}|{MANIFEST_SUFFIX})$")
        for f in self.out_dir.iterdir() if clean else ():
            if f.is_file() and stale.match(f.name):
                f.unlink()
        self.first_index = first_index
        self.rows_per_shard, self.prefix, self.block_rows = rows_per_shard, prefix, block_rows
        self.fields = input_fields(schema)
        self.files: list[TFRecordFile] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._out: BinaryIO | None = None
        self._tmp: Path | None = None
        self._rows = self._records = 0  # of the open file

    def write(self, batch: pa.RecordBatch) -> None:
        """Adds ``batch``'s rows (its columns named by field; other columns are ignored)."""
        missing = [f.name for f in self.fields if f.name not in batch.schema.names]
        if missing:
            raise DataError(
                f"{self.out_dir}: a batch written to TFRecord shards lacks the columns "
                f"{missing}; it has {batch.schema.names}"
            )
        if batch.num_rows:
            self._pending.append(batch.select([f.name for f in self.fields]))
            self._pending_rows += batch.num_rows
        if self._pending_rows >= _FLUSH_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        """Writes the pending rows' whole blocks (all of them when ``final``)."""
        if not self._pending_rows:
            return
        table = pa.Table.from_batches(self._pending)
        columns = encode_columns(table, self.fields)
        start, n = 0, table.num_rows
        while start < n:
            take = min(self.block_rows, self.rows_per_shard - self._rows, n - start)
            if take < self.block_rows and self._rows + take < self.rows_per_shard and not final:
                break  # a partial block: wait for more rows
            self._write_block(columns, start, start + take)
            start += take
        rest = table.slice(start)
        self._pending = rest.to_batches() if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _write_block(self, columns: list[EncodedColumn], lo: int, hi: int) -> None:
        if self._out is None:
            name = f"{self.prefix}-{self.first_index + len(self.files):05d}{SUFFIX}"
            self._tmp = self.out_dir / f".{name}.tmp"
            self._out = self._tmp.open("wb")
        pad = self.block_rows - (hi - lo)
        self._out.write(frame(example(columns, lo, hi, pad)))
        self._rows += hi - lo
        self._records += 1
        if self._rows == self.rows_per_shard:
            self._finish()

    def _finish(self) -> None:
        self._out.close()
        final = self.out_dir / self._tmp.name[1:-4]
        self._tmp.replace(final)
        self.files.append(TFRecordFile(final, self._rows, self._records, final.stat().st_size))
        self._out, self._tmp = None, None
        self._rows = self._records = 0

    def finish(self) -> list[TFRecordFile]:
        """Writes the last rows and completes the last file; returns the files in order (no
        manifest: ``close`` writes it)."""
        self._flush(final=True)
        if self._out is not None:
            self._finish()
        return list(self.files)

    def close(self) -> list[Path]:
        """``finish``, then the manifest; returns the file paths in order."""
        files = self.finish()
        write_manifest(
            manifest_path(self.out_dir, self.prefix),
            self.block_rows,
            field_types(self.fields),
            files,
        )
        return [f.path for f in files]

    def abort(self) -> None:
        """Drops the unfinished file (after an error); no manifest is written."""
        if self._out is not None:
            self._out.close()
            self._tmp.unlink(missing_ok=True)
            self._out, self._tmp = None, None
        self._pending, self._pending_rows = [], 0


def field_types(fields: list) -> dict[str, str]:
    """Each field's list type in the records (the manifest's ``fields``)."""
    return {f.name: list_type(f) for f in fields}
