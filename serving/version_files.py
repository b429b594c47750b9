"""Complete model versions: written under a hidden name, marked complete, renamed into place.

A writer of a version folder (``stitchrec export``, ``serving.testing.write_linear_model``)
writes it with ``atomic_dir(final)``: into a hidden sibling ``.<name>.tmp-<pid>`` (same parent,
so the rename is atomic), then, last, the completion marker ``assets.extra/stitchrec.done``
(JSON: ``{"files": {relative path: size in bytes}}``, every other file of the folder), then
every file and folder is fsynced and the folder renamed to ``final``. An existing ``final`` is
moved away to ``.<name>.old-<pid>`` first, the new folder renamed in, the old one deleted (POSIX
has no atomic swap of two folders: for that instant ``final`` is absent, never half written).
A writer killed midway leaves only a hidden folder; the next ``atomic_dir`` in the same parent
deletes the hidden folders of processes that no longer run.

A reader decides with ``version_state(folder)``:

- ``COMPLETE``: the marker is there and every file it lists has its size;
- ``INCOMPLETE``: a marker whose files are missing or of another size (a copy in progress), or
  no ``saved_model.pb``, or a ``variables/`` folder without ``variables.index``;
- ``UNMARKED``: no marker, ``saved_model.pb`` and (when there is a ``variables/`` folder)
  ``variables/variables.index``: a SavedModel written by another tool (``tf.saved_model.save``).
  ``SettledVersions`` accepts it once its ``tree_fingerprint`` is the same on two scans.

Hidden names (``is_hidden``) are never versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

MARKER = Path("assets.extra") / "stitchrec.done"
COMPLETE, INCOMPLETE, UNMARKED = "complete", "incomplete", "unmarked"

_TEMP = re.compile(r"^\..+\.(?:tmp|old)-(\d+)$")


def is_hidden(name: str) -> bool:
    """A hidden name (leading dot): a writer's temporary folder, never a version."""
    return name.startswith(".")


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) is not a probe elsewhere: keep every folder
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_leftovers(parent: Path) -> list[Path]:
    """Deletes the temporary folders ``atomic_dir`` left in ``parent`` for processes of this
    machine that no longer run (a killed export); returns them."""
    gone = []
    if not parent.is_dir():
        return gone
    for p in parent.iterdir():
        m = _TEMP.match(p.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _ours(path: Path) -> bool:
    m = _TEMP.match(path.name)
    return bool(m) and int(m.group(1)) == os.getpid()


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yields a temporary folder path (not yet created) to write the version ``final`` into;
    on a normal exit writes the marker, fsyncs and renames it to ``final`` (replacing it), on an
    exception deletes it and leaves ``final`` as it was.

    Inside another ``atomic_dir`` of this process (``final`` is its temporary folder) it yields
    ``final`` itself: the outer one marks and renames.
    """
    final = Path(final)
    if _ours(final):
        yield final
        return
    clean_leftovers(final.parent)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        yield tmp
        write_marker(tmp)
        _fsync_tree(tmp)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _files(folder: Path) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = Path(dirpath) / n
            with contextlib.suppress(FileNotFoundError):
                out[p.relative_to(folder).as_posix()] = p.stat().st_size
    return out


def write_marker(folder: Path) -> Path:
    """Writes ``folder``'s completion marker (its files and their sizes); returns its path."""
    marker = folder / MARKER
    files = {k: v for k, v in _files(folder).items() if k != MARKER.as_posix()}
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1))
    return marker


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):  # folders cannot be opened on some systems
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, names in os.walk(folder):
        for n in names:
            _fsync(Path(dirpath) / n)
        _fsync(Path(dirpath))


def _swap_in(tmp: Path, final: Path) -> None:
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            os.replace(old, final)
            raise
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
    else:
        os.replace(tmp, final)
    _fsync(final.parent)


def version_state(folder: Path) -> tuple[str, str]:
    """``(COMPLETE | INCOMPLETE | UNMARKED, why)`` of a version folder (module docstring)."""
    marker = folder / MARKER
    if marker.is_file():
        try:
            files = json.loads(marker.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return INCOMPLETE, f"{MARKER} is unreadable"
        for rel, size in files.items():
            try:
                got = (folder / rel).stat().st_size
            except OSError:
                return INCOMPLETE, f"{rel} (listed in {MARKER}) is missing"
            if got != size:
                return INCOMPLETE, f"{rel} has {got} bytes, {MARKER} lists {size}"
        return COMPLETE, ""
    if not ((folder / "saved_model.pb").is_file() or (folder / "saved_model.pbtxt").is_file()):
        return INCOMPLETE, "no saved_model.pb"
    if (folder / "variables").is_dir() and not (folder / "variables/variables.index").is_file():
        return INCOMPLETE, "variables/ has no variables.index"
    return UNMARKED, f"no {MARKER}"


def tree_fingerprint(folder: Path) -> str:
    """Changes when any file under ``folder`` changes: a digest of every file's relative path,
    size and mtime (ns)."""
    h = hashlib.sha256()
    entries = []
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = Path(dirpath) / n
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                entries.append(
                    f"{p.relative_to(folder).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}"
                )
    for e in sorted(entries):
        h.update(e.encode() + b"\n")
    return h.hexdigest()


class SettledVersions:
    """Which version folders a repository may load, scan after scan.

    ``COMPLETE``: at once. ``UNMARKED``: on the first scan (the repository at server start), else
    once its fingerprint is the same on two consecutive scans (it did not change for one poll
    interval). ``INCOMPLETE``: not yet.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], str] = {}

    def loadable(self, key: tuple[str, int], folder: Path, first_scan: bool) -> tuple[bool, str]:
        """``(may load, why not)`` for ``folder``, the version ``key = (model, version)``."""
        state, why = version_state(folder)
        if state == COMPLETE:
            self._seen.pop(key, None)
            return True, ""
        stamp = tree_fingerprint(folder)
        before = self._seen.get(key)
        self._seen[key] = stamp
        if state == UNMARKED and (first_scan or before == stamp):
            return True, ""
        return False, why if state == INCOMPLETE else f"{why}; waiting until it stops changing"

    def forget(self, name: str, keep: set[int]) -> None:
        """Drops the records of model ``name``'s versions not in ``keep``."""
        for key in [k for k in self._seen if k[0] == name and k[1] not in keep]:
            del self._seen[key]
