"""The files of ``stitchrec windows`` (``features.windows``): a CSV log read in blocks as text
columns, and the part files each window's rows are appended to.

Every cell is read as text (only an empty cell is missing) and written back as read: a CSV part
quotes a cell only where it must (a delimiter, quote or line break in it), a Parquet part holds
string columns. A window's rows go to ``window-XXX/part-00000.<format>``; ``PartWriters`` keeps
at most ``max_open`` parts open (the least recently written is closed first): a CSV part closed
early is appended to when its window gets rows again, a Parquet window continues in its next
part (``part-00001.parquet``, ...).
"""

from __future__ import annotations

import collections
import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from features.csv_format import read_header, string_convert_options
from features.read_report import DataError

FORMATS = ("csv", "parquet")


def csv_header(path: Path) -> list[str]:
    """The column names of a comma-separated file's header line."""
    return read_header(path, ",")


def read_blocks(
    path: Path, names: list[str], columns: Sequence[str] | None = None, block_size: int = 1 << 20
) -> Iterator[pa.RecordBatch]:
    """The data rows of ``path`` (a CSV file with the header ``names``) in blocks of about
    ``block_size`` bytes, as string columns (``columns``: only those, in that order)."""
    read_opts = pacsv.ReadOptions(use_threads=False, block_size=block_size)
    convert = string_convert_options(names)
    if columns is not None:
        convert.include_columns = list(columns)
    rows = 0
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=read_opts,
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=convert,
        )
        for batch in reader:
            rows += batch.num_rows
            yield batch
    except pa.ArrowException as e:
        raise DataError(
            f"{path}: could not parse CSV after data row {rows}: {e}; expected comma-separated "
            f"UTF-8 text with {len(names)} columns a row"
        ) from None
    except OSError as e:  # pyarrow's decompressor: a truncated or corrupt gzip/bz2 stream
        raise DataError(f"{path}: unreadable after data row {rows}: {e}") from None


class _CsvPart:
    def __init__(self, path: Path, names: list[str], new: bool) -> None:
        self.file: IO[str] = path.open("a" if not new else "w", newline="", encoding="utf-8")
        self.writer = csv.writer(self.file, lineterminator="\n")
        if new:
            self.writer.writerow(names)

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.writerows(zip(*(c.to_pylist() for c in batch.columns), strict=True))

    def close(self) -> None:
        self.file.close()


class _ParquetPart:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.writer = pq.ParquetWriter(str(path), schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)

    def close(self) -> None:
        self.writer.close()


class PartWriters:
    """Appends rows to the part files of the windows ``folders`` (created on first use).

    Args:
      folders: the window folders, by window index.
      names: the columns, as in the input's header.
      output_format: ``"csv"`` or ``"parquet"``.
      max_open: the most part files open at once (>= 1).
    """

    def __init__(
        self, folders: list[Path], names: list[str], output_format: str, max_open: int = 64
    ) -> None:
        if output_format not in FORMATS:
            raise ValueError(f"output_format must be one of {FORMATS}, got {output_format!r}")
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.folders, self.names, self.format, self.max_open = (
            folders,
            names,
            output_format,
            max_open,
        )
        self.schema = pa.schema([(n, pa.string()) for n in names])
        self.parts = [0] * len(folders)  # part files created per window
        self.open: collections.OrderedDict[int, _CsvPart | _ParquetPart] = collections.OrderedDict()

    def write(self, window: int, batch: pa.RecordBatch) -> None:
        """Appends ``batch`` (string columns ``names``) to window ``window``."""
        part = self.open.get(window)
        if part is None:
            part = self._open(window)
        self.open.move_to_end(window)
        part.write(batch)

    def _open(self, window: int) -> _CsvPart | _ParquetPart:
        while len(self.open) >= self.max_open:
            self.open.popitem(last=False)[1].close()
        folder = self.folders[window]
        folder.mkdir(parents=True, exist_ok=True)
        if self.format == "csv":
            part: _CsvPart | _ParquetPart = _CsvPart(
                folder / "part-00000.csv", self.names, new=self.parts[window] == 0
            )
            self.parts[window] = 1
        else:
            part = _ParquetPart(folder / f"part-{self.parts[window]:05d}.parquet", self.schema)
            self.parts[window] += 1
        self.open[window] = part
        return part

    def close(self) -> None:
        """Closes every open part file."""
        while self.open:
            self.open.popitem(last=False)[1].close()
