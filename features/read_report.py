"""Bad input data and what a read did: ``DataError`` (``not_parquet``: a shard that does not
open), ``ReadReport``, the bad-row budget of one read (``max_bad_rows``) and the short name lists
of the messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

_MAX_EXAMPLES = 10


class DataError(ValueError):
    """Bad input data; the message names the file, line/row, column, value and expectation."""


#: suffixes of raw text logs (plain or compressed), which are read through a schema
TEXT_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".gz", ".bz2", ".zst"})


def not_parquet(path: str | Path, error: object) -> DataError:
    """The error for a Parquet shard that does not open, pointing a raw text file (by its
    suffix) to the schema it is read with."""
    message = f"{path}: not a readable Parquet file ({error})"
    if Path(path).suffix.lower() in TEXT_SUFFIXES:
        message += "; a raw text file is read through its schema (--schema NAME)"
    return DataError(message)


@dataclasses.dataclass
class ReadReport:
    """What a read did: good rows yielded, bad rows skipped (with the first messages), files."""

    rows: int = 0
    bad_rows: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)
    files: int = 0


# --------------------------------------------------------------------------------------------
# Bad rows


class BadRowBudget:
    """Counts bad rows of one read against ``max_bad_rows``; records them in the report."""

    def __init__(self, max_bad_rows: int, report: ReadReport) -> None:
        self.max_bad_rows = max_bad_rows
        self.report = report
        self.count = 0

    def add(self, message: str) -> None:
        """Counts one bad row; raises DataError once there are more than ``max_bad_rows``."""
        self.count += 1
        if self.count > self.max_bad_rows:
            if self.max_bad_rows == 0:
                raise DataError(message)
            raise DataError(
                f"more than max_bad_rows = {self.max_bad_rows} bad rows (limit exceeded); "
                f"bad row {self.count}: {message}"
            )
        self.report.bad_rows += 1
        if len(self.report.examples) < _MAX_EXAMPLES:
            self.report.examples.append(message)


def short_list(names: Sequence[str], limit: int = 30) -> str:
    """A list of names for a message, abbreviated past ``limit`` entries."""
    if len(names) <= limit:
        return repr(list(names))
    return repr(list(names[:limit]))[:-1] + f", ... ({len(names) - limit} more)]"
