"""The error a command raises for a flag or argument it cannot use, the check of an output
path every writing command makes before it starts, and the temporary folder a command writes
its output folder into.

``stitchrec`` (``pipelines.cli``) prints a user error as one ``error:`` line and exits with
status 2; any other exception is a bug and propagates with its traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path


class UsageError(ValueError):
    """A command-line flag or argument that cannot be used; names the flag, the value given and
    what was expected."""


def check_output_path(path: str | Path, flag: str = "--output", folder: bool = True) -> None:
    """Raises UsageError when ``path`` cannot be the output ``flag`` names: with ``folder``, an
    existing file, or a path under a file; without, an existing folder or a path under a file.
    A path that does not exist yet passes when its nearest existing parent is a folder."""
    p = Path(path)
    if p.exists():
        if folder and not p.is_dir():
            raise UsageError(f"{flag} {str(p)!r} is a file: expected a folder")
        if not folder and p.is_dir():
            raise UsageError(f"{flag} {str(p)!r} is a folder: expected a file path")
        return
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(
                    f"{flag} {str(p)!r}: {str(parent)!r} is a file, so nothing can be written "
                    f"under it; expected a path under a folder"
                )
            return


@contextlib.contextmanager
def replacing_folder(
    path: str | Path, markers: Sequence[str], command: str, flag: str = "--output"
) -> Iterator[Path]:
    """Yields a hidden temporary folder beside ``path`` (created) for ``command`` to write its
    output into; on a normal exit it replaces ``path`` with it, on an exception it is deleted
    and ``path`` stays as it was. A reader never sees a partly written output.

    Raises:
      UsageError: before anything is written, when ``path`` exists and is neither an empty
        folder nor an earlier output of ``command`` (a folder holding one of ``markers``).
    """
    out = Path(path)
    check_output_path(out, flag)
    if out.exists() and any(out.iterdir()) and not any((out / m).exists() for m in markers):
        raise UsageError(
            f"{flag} {str(out)!r} holds files that are not a `stitchrec {command}` output (no "
            f"{' or '.join(markers)}): expected a new or empty folder, or an earlier {command} "
            "output (which is replaced)"
        )
    tmp = out.parent / f".{out.name}.{command}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
