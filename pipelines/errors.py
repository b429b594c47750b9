"""The error a command raises for a flag or argument it cannot use, and the check of an output
path every writing command makes before it starts.

``stitchrec`` (``pipelines.cli``) prints a user error as one ``error:`` line and exits with
status 2; any other exception is a bug and propagates with its traceback.
"""

from __future__ import annotations

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
