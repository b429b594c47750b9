"""The manifest a ``TFRecordShardWriter`` writes beside its files, and the listing readers
start from (no TensorFlow).

``<out_dir>/<prefix>.tfrecord.json``, written last (under a hidden name, then renamed), names
the writer's files with their rows, records and bytes, the block size and every field's list
type (``features.tfrecord.encode``)::

    {"format": "stitchrec-tfrecord-blocks", "version": 1, "block_rows": 1024,
     "fields": {"label": "float", "C1": "bytes", "item": "int64"},
     "files": [{"name": "part-00000.tfrecord", "rows": 100000, "records": 98,
                "bytes": 31243260}]}

A ``.tfrecord`` file no manifest lists (a writer killed before ``close``), a listed file that is
missing or whose size differs, or shards of different block sizes are a ``DataError``: readers
never see a half-written output, and know every file's rows without reading it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from features.completion import check_complete
from features.read_report import DataError
from features.schema import Schema

FORMAT = "stitchrec-tfrecord-blocks"
VERSION = 1
SUFFIX = ".tfrecord"
MANIFEST_SUFFIX = ".tfrecord.json"


@dataclasses.dataclass(frozen=True)
class TFRecordFile:
    """One finished file: its path, rows (fill rows excluded), records and size in bytes."""

    path: Path
    rows: int
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class TFRecordShards:
    """Files listed by manifests (sorted by path), their block size and field list types."""

    files: tuple[TFRecordFile, ...]
    block_rows: int
    fields: Mapping[str, str]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def manifest_path(out_dir: Path, prefix: str) -> Path:
    return Path(out_dir) / f"{prefix}{MANIFEST_SUFFIX}"


def write_manifest(
    path: Path, block_rows: int, fields: Mapping[str, str], files: Sequence[TFRecordFile]
) -> None:
    """Writes the manifest of ``files`` (in ``path``'s folder) atomically."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "block_rows": block_rows,
        "fields": dict(fields),
        "files": [
            {"name": f.path.name, "rows": f.rows, "records": f.records, "bytes": f.bytes}
            for f in files
        ],
    }
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _read_manifest(path: Path) -> tuple[int, dict[str, str], list[TFRecordFile]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a readable TFRecord manifest ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a TFRecord manifest (expected format {FORMAT!r})")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: manifest version {data.get('version')!r}, expected {VERSION}")
    files = [
        TFRecordFile(path.parent / f["name"], int(f["rows"]), int(f["records"]), int(f["bytes"]))
        for f in data["files"]
    ]
    return int(data["block_rows"]), dict(data["fields"]), files


def _candidates(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """(``.tfrecord`` files named or found under ``paths``, the folders holding them)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files.extend(sorted(p.glob(f"*{SUFFIX}")))
        elif p.exists():
            files.append(p)
        else:
            files.extend(Path(m) for m in sorted(glob.glob(str(p))) if m.endswith(SUFFIX))
    return files, sorted({f.parent for f in files})


def list_tfrecord(paths: str | Path | Sequence[str | Path]) -> TFRecordShards:
    """The TFRecord shards under ``paths`` (files, folders or glob patterns) with their rows,
    from the manifests of their folders.

    Raises FileNotFoundError when there are none, DataError for a file no manifest lists, a
    listed file missing or of another size, folders of different block sizes or field types,
    or files in an unfinished conversion (``features.completion``)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    wanted, folders = _candidates(paths)
    if not wanted:
        raise FileNotFoundError(f"no TFRecord files found under {[str(p) for p in paths]}")
    check_complete(folders)
    listed: dict[Path, TFRecordFile] = {}
    blocks: dict[int, Path] = {}
    fields: dict[str, str] | None = None
    for folder in folders:
        for manifest in sorted(folder.glob(f"*{MANIFEST_SUFFIX}")):
            block_rows, types, files = _read_manifest(manifest)
            blocks.setdefault(block_rows, manifest)
            if fields is not None and types != fields:
                raise DataError(f"{manifest}: field types {types} differ from {fields}")
            fields = types
            for f in files:
                if not f.path.exists():
                    raise DataError(f"{manifest} lists {f.path.name}, which is missing")
                listed[f.path] = f
    if len(blocks) > 1:
        raise DataError(f"TFRecord shards of different block sizes: {blocks}")
    out = []
    for path in wanted:
        f = listed.get(path)
        if f is None:
            raise DataError(
                f"{path}: no manifest ({MANIFEST_SUFFIX}) in its folder lists it: the output "
                "of a writer that did not finish; write the shards again"
            )
        size = path.stat().st_size
        if size != f.bytes:
            raise DataError(
                f"{path}: {size} bytes, but its manifest says {f.bytes}: the file changed after "
                "it was written; write the shards again"
            )
        out.append(f)
    return TFRecordShards(tuple(out), next(iter(blocks)), fields or {})


def check_fields(shards: TFRecordShards, schema: Schema, types: Mapping[str, str]) -> None:
    """Raises DataError unless the shards hold every field of ``types`` (``{name: list
    type}``, what ``schema`` needs) with that list type."""
    where = shards.files[0].path.parent
    for name, want in types.items():
        have = shards.fields.get(name)
        if have is None:
            raise DataError(
                f"{where}: TFRecord shards lack field {name!r} that schema {schema.name!r} "
                f"needs; they hold {sorted(shards.fields)}"
            )
        if have != want:
            raise DataError(
                f"{where}: TFRecord field {name!r} is a {have} list, schema {schema.name!r} "
                f"expects a {want} list"
            )
