"""Reading a JSON object from a file a command takes from the user's folders (a run's
statistics, a model's metadata, an artifact): ``read_json_object`` turns a file that is not
UTF-8, not JSON or not an object into one ``DataError`` naming the file and what belongs there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from features.read_report import DataError

_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def read_json_object(path: str | Path, expected: str) -> dict[str, Any]:
    """The JSON object in the file ``path``; DataError naming the file and ``expected`` (what
    should be there, e.g. "the model config `stitchrec train` writes") when the file is not
    UTF-8 JSON text or holds another JSON value than an object."""
    p = Path(path)
    try:
        value = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(
            f"{str(p)!r} is not UTF-8 text (byte {e.start}): expected {expected}"
        ) from None
    except json.JSONDecodeError as e:
        raise DataError(
            f"{str(p)!r} is not valid JSON ({e.msg}: line {e.lineno} column {e.colno}): "
            f"expected {expected}"
        ) from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "value")
        raise DataError(f"{str(p)!r} holds a JSON {kind}, not an object: expected {expected}")
    return value
