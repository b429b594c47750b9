"""Whole-file writes: a file is written to ``.<name>.tmp-<pid>`` beside it, fsynced, then renamed
over it (``os.replace``), so a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | Path, text: str) -> None:
    """Writes ``text`` to ``path`` whole (module docstring); the temporary file is removed when
    the write fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # folders cannot be opened on some systems
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Writes ``value`` as JSON (indent 1) to ``path`` whole (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(value, indent=1))
