"""The error a command raises for a flag or argument it cannot use, the check of an output
path every writing command makes before it starts, and the reading of a JSON file a command
takes from the user's folders (``read_json_object``).

``stitchrec`` (``pipelines.cli``) prints a user error as one ``error:`` line and exits with
status 2; any other exception is a bug and propagates with its traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def read_json_object(path: str | Path, expected: str) -> dict[str, Any]:
    """The JSON object in the file ``path``; UsageError naming the file and ``expected`` (what
    should be there, e.g. "the model config `stitchrec train` writes") when the file is not
    UTF-8 JSON text or holds another JSON value than an object."""
    p = Path(path)
    try:
        value = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{str(p)!r} is not UTF-8 text (byte {e.start}): expected {expected}"
        ) from None
    except json.JSONDecodeError as e:
        raise UsageError(
            f"{str(p)!r} is not valid JSON ({e.msg}: line {e.lineno} column {e.colno}): "
            f"expected {expected}"
        ) from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "value")
        raise UsageError(f"{str(p)!r} holds a JSON {kind}, not an object: expected {expected}")
    return value
