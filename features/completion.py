"""Completion markers of a converted folder (``stitchrec convert``).

A conversion writes ``convert.json`` (what it converts) first and ``_SUCCESS`` (what it read)
last, into a temporary folder that is renamed into place once complete. A folder holding
``convert.json`` but no ``_SUCCESS`` is the remains of a conversion that did not finish;
``check_complete`` refuses to read its shards (``features.readers.list_files`` and
``features.dataset.list_parquet`` call it for every folder they read files from).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from features.read_report import DataError

STARTED = "convert.json"
SUCCESS = "_SUCCESS"


def mark_started(folder: Path, info: dict[str, Any]) -> None:
    """Writes ``folder/convert.json``: the first file of a conversion."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STARTED).write_text(json.dumps(info, indent=1, default=str) + "\n")


def mark_complete(folder: Path, summary: dict[str, Any]) -> None:
    """Writes ``folder/_SUCCESS``: the last file of a conversion."""
    (folder / SUCCESS).write_text(json.dumps(summary, indent=1, default=str) + "\n")


def unfinished(folder: Path) -> Path | None:
    """The converted folder (``folder`` or its parent, e.g. ``out`` of ``out/train``) that a
    conversion started but did not finish, else None."""
    for d in (folder, folder.parent):
        if (d / STARTED).is_file() and not (d / SUCCESS).exists():
            return d
    return None


def check_complete(folders: Iterable[Path]) -> None:
    """Raises DataError naming the first of ``folders`` that lies in an unfinished conversion."""
    for folder in dict.fromkeys(Path(f) for f in folders):
        d = unfinished(folder)
        if d is not None:
            raise DataError(
                f"{str(folder)!r} is in an unfinished conversion: {str(d)!r} has {STARTED} but "
                f"no {SUCCESS} (written last, when every shard is complete); run "
                f"`stitchrec convert` again"
            )
