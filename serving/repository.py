"""The model repository: ``<root>/<name>/<version>/`` SavedModels, loaded, warmed and swapped.

Layout (the same as TF Serving and Triton)::

    models/
      ctr/                 # model name
        1/                 # version: a positive integer, a SavedModel folder
          saved_model.pb
          variables/...
          assets.extra/schema.toml, stitchrec.json   # written by `stitchrec export`
          assets.extra/stitchrec.done                # completion marker, written last
        2/
        .3.tmp-4711/       # hidden: a version being written (never a version)

Which folders are versions (``serving.version_files``): a positive-integer name (hidden names
never are) that is complete: its marker ``assets.extra/stitchrec.done`` lists every file and
its size, and each is there with that size (``stitchrec export`` and
``serving.testing.write_linear_model`` write it last, then rename the folder into place). A
SavedModel without the marker (``tf.saved_model.save`` by another tool) needs
``saved_model.pb`` and, when it has a ``variables/`` folder, ``variables/variables.index``; it
is loaded at server start, and when it appears later once it has not changed between two scans
(one poll interval). A version that is not complete yet is skipped (logged once as
``waiting``) until it is.

Version policies (per model, default ``latest``):

- ``latest`` / ``latest:N``: the N highest versions on disk;
- ``all``: every version on disk;
- ``specific:1,3``: exactly these versions.

A version is served only once it is loaded on every model instance (one per GPU, round robin,
or one on the CPU) and warmed up (the serving signature has run on dummy batches). The
repository polls the root every ``poll_interval_s``: a new version is loaded and warmed while the
old one keeps serving, then the live set is swapped in one step (requests already queued on the
old version finish on it: its batcher is drained before it is released), so a hot swap fails no
request. Rollback: a version that fails to load or warm up is marked failed (state END with the
error) and the previous version keeps serving; deleting the newest version folder (or pinning
``specific:N``) reloads the previous one before the newer one is unloaded. A failed version is
retried when any file under it changes (``tree_fingerprint``: every file's path, size and
mtime), once it is complete again.

The heap is frozen after every scan that changed the live versions (``freeze_heap``): a full
garbage collection, then ``gc.freeze()``, so that the objects of the loaded models (TensorFlow's
and Keras's Python objects, hundreds of thousands of them) are no longer scanned by the
collector's later full passes. Those passes run more often as requests allocate (a traced call
allocates spans), and each one holds the interpreter lock for as long as it scans, so every
request in flight waits. The collection pauses the server once per version change (about 0.1 s
on a 2-core machine with TensorFlow loaded); an unloaded version's objects are unfrozen first,
so that collection frees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from serving.config import BatchingConfig, VersionPolicy, VersionState
from serving.model_version import (
    ModelNotFound,
    ModelVersion,
    VersionStatus,
    available_devices,
)
from serving.version_files import SettledVersions, is_hidden, tree_fingerprint

log = logging.getLogger("stitchrec.serving.repository")


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """The version folders of one model: positive-integer names (complete or not, see
    ``serving.version_files.version_state``)."""
    out = {}
    if not model_dir.is_dir():
        return out
    for p in model_dir.iterdir():
        if p.is_dir() and p.name.isdigit() and int(p.name) > 0:
            out[int(p.name)] = p
    return out


class ModelRepository:
    """Loads ``<root>/<name>/<version>/`` SavedModels and keeps the served set up to date.

    ``freeze``: freeze the heap after every scan that changed the live versions (module
    docstring)."""

    def __init__(
        self,
        root: str | Path,
        *,
        policy: VersionPolicy | str = "latest",
        policies: dict[str, VersionPolicy | str] | None = None,
        batching: BatchingConfig | None = None,
        poll_interval_s: float = 0.0,
        warmup_sizes: Iterable[int] = (1, 100),
        devices: list[str] | None = None,
        fusion: bool = True,
        on_batch: Callable[[str, int, int, list[float]], None] | None = None,
        on_change: Callable[[str, int, str], None] | None = None,
        freeze: bool = True,
    ):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {str(self.root)!r} is not a directory")
        self.policy = VersionPolicy.parse(policy) if isinstance(policy, str) else policy
        self.policies = {
            k: VersionPolicy.parse(v) if isinstance(v, str) else v
            for k, v in (policies or {}).items()
        }
        self.batching = batching or BatchingConfig()
        if poll_interval_s < 0:
            raise ValueError(f"poll_interval_s must be >= 0, got {poll_interval_s}")
        self.poll_interval_s = poll_interval_s
        self.warmup_sizes = tuple(
            sorted(set(warmup_sizes) | set(self.batching.preferred_batch_sizes))
        )
        self.devices = devices or available_devices()
        self.fusion = fusion
        self.freeze = freeze
        self._on_batch = on_batch
        self._on_change = on_change
        self._live: dict[str, dict[int, ModelVersion]] = {}
        self._status: dict[str, dict[int, VersionStatus]] = {}
        self._failed: dict[tuple[str, int], str] = {}
        self._settled = SettledVersions()
        self._waiting: set[tuple[str, int]] = set()  # versions not yet loadable, logged
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task | None = None
        self.loaded_once = False
        # called after every scan (the server updates grpc.health.v1 from ``ready()``)
        self.after_poll: Callable[[], Awaitable[None]] | None = None

    # --- queries (no await: a request reads the live set and submits in one step) ---

    def model_names(self) -> list[str]:
        return sorted(set(self._live) | set(self._status))

    def policy_of(self, name: str) -> VersionPolicy:
        return self.policies.get(name, self.policy)

    def get(self, name: str, version: int | None = None) -> ModelVersion:
        """The live version ``version`` of ``name`` (None or 0: the highest live version)."""
        live = self._live.get(name)
        if not live:
            if name in self._status:
                raise ModelNotFound(
                    f"model {name!r} has no ready version (versions: {self._describe(name)})"
                )
            raise ModelNotFound(
                f"unknown model {name!r}; the server serves {sorted(self._live) or 'no models'}"
            )
        if not version:
            return live[max(live)]
        mv = live.get(version)
        if mv is None:
            raise ModelNotFound(
                f"model {name!r} has no ready version {version}; ready versions: "
                f"{sorted(live)} (version policy {self.policy_of(name)})"
            )
        return mv

    def ready(self, name: str | None = None, version: int | None = None) -> bool:
        if name is None:
            return self.loaded_once and all(self._live.get(n) for n in self.model_names())
        try:
            self.get(name, version)
        except ModelNotFound:
            return False
        return True

    def live_versions(self, name: str) -> list[int]:
        return sorted(self._live.get(name, {}))

    def status(self, name: str) -> dict[int, VersionStatus]:
        if name not in self._status:
            raise ModelNotFound(
                f"unknown model {name!r}; the server has {self.model_names() or 'no models'}"
            )
        return dict(self._status[name])

    def _describe(self, name: str) -> str:
        """The versions of ``name`` and their states, for clients: load errors without the
        repository's path."""
        root = str(self.root)
        return ", ".join(
            f"{v}: {s.state}{' (' + s.error.replace(root, '<repository>') + ')' if s.error else ''}"
            for v, s in sorted(self._status.get(name, {}).items())
        )

    # --- lifecycle ---

    async def start(self) -> None:
        """Loads what the policies select, then polls for changes if ``poll_interval_s > 0``."""
        await self.poll()
        self.loaded_once = True
        if self.poll_interval_s > 0:
            self._poller = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.poll()
            except Exception:  # keep polling: one bad folder must not stop the server
                log.exception("model repository poll failed")

    async def stop_polling(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    def flush(self) -> None:
        """Every live version's batcher dispatches its queue at once (see DynamicBatcher.flush)."""
        for versions in self._live.values():
            for mv in versions.values():
                if mv.batcher is not None:
                    mv.batcher.flush()

    async def close(self) -> None:
        """Stops polling and unloads every version after its in-flight requests finish."""
        await self.stop_polling()
        async with self._lock:
            for name in list(self._live):
                old = self._live.pop(name)
                for mv in old.values():
                    await self._unload(mv)

    async def poll(self) -> None:
        """One scan of the root: load new versions, swap, unload the ones no longer selected."""
        async with self._lock:
            before = self._live_keys()
            disk = {
                p.name: self._loadable(p.name, version_dirs(p))
                for p in sorted(self.root.iterdir())
                if p.is_dir() and not is_hidden(p.name)
            }
            for name in sorted(set(disk) | set(self._live)):
                await self._sync(name, disk.get(name, {}))
            if self.freeze and self._live_keys() != before:
                t0 = time.monotonic()
                frozen = freeze_heap()
                seconds = round(time.monotonic() - t0, 3)
                log.info(
                    json.dumps({"event": "heap_frozen", "objects": frozen, "seconds": seconds})
                )
        if self.after_poll is not None and self.loaded_once:
            await self.after_poll()

    def _live_keys(self) -> set[tuple[str, int]]:
        return {(name, v) for name, versions in self._live.items() for v in versions}

    def _set_status(
        self,
        name: str,
        version: int,
        state: VersionState,
        error: str = "",
        mv: ModelVersion | None = None,
    ) -> None:
        self._status.setdefault(name, {})[version] = VersionStatus(state, error)
        if mv is not None:
            mv.state, mv.error = state, error
        if self._on_change is not None:
            self._on_change(name, version, state)

    def _loadable(self, name: str, dirs: dict[int, Path]) -> dict[int, Path]:
        """The versions of ``dirs`` to consider: live ones, failed ones (kept failed until a
        file under them changes: then retried) and the complete ones (``SettledVersions``)."""
        out = {}
        live = self._live.get(name, {})
        for v, path in dirs.items():
            key = (name, v)
            if v in live:
                out[v] = path
                continue
            ok, why = self._settled.loadable(key, path, first_scan=not self.loaded_once)
            failed = self._failed.get(key)
            if failed is not None:
                out[v] = path
                if ok and failed != tree_fingerprint(path):
                    del self._failed[key]
            elif ok:
                out[v] = path
            if why and key not in self._waiting:
                log.info(json.dumps({"event": "waiting", "model": name, "version": v, "why": why}))
                self._waiting.add(key)
            elif not why:
                self._waiting.discard(key)
        self._settled.forget(name, set(dirs) - set(live))
        self._waiting = {k for k in self._waiting if k[0] != name or k[1] in dirs}
        return out

    async def _sync(self, name: str, on_disk: dict[int, Path]) -> None:
        policy = self.policy_of(name)
        live = dict(self._live.get(name, {}))
        loop = asyncio.get_running_loop()
        for n, v in list(self._failed):
            if n == name and v not in on_disk:
                del self._failed[(n, v)]
                self._status.get(name, {}).pop(v, None)
        while True:
            candidates = [v for v in on_disk if (name, v) not in self._failed]
            desired = policy.select(candidates)
            todo = [v for v in desired if v not in live]
            if not todo:
                break
            for v in sorted(todo, reverse=True):
                self._set_status(name, v, VersionState.LOADING)
                t0 = time.monotonic()
                stamp = tree_fingerprint(on_disk[v])  # before: a change during the load retries
                try:
                    mv = await loop.run_in_executor(None, self._load, name, v, on_disk[v])
                except Exception as e:  # rollback: keep serving what is live
                    self._failed[(name, v)] = stamp
                    msg = f"{type(e).__name__}: {e}".splitlines()[0][:500]
                    self._set_status(name, v, VersionState.END, msg)
                    log.error(
                        json.dumps(
                            {"event": "load_failed", "model": name, "version": v, "error": msg}
                        )
                    )
                    continue
                mv.start(self.batching, self._batch_callback(name))
                live[v] = mv
                self._set_status(name, v, VersionState.AVAILABLE, mv=mv)
                log.info(
                    json.dumps(
                        {
                            "event": "loaded",
                            "model": name,
                            "version": v,
                            "seconds": round(time.monotonic() - t0, 3),
                            "devices": self.devices,
                        }
                    )
                )
        keep = {v: mv for v, mv in live.items() if v in desired}
        gone = [mv for v, mv in live.items() if v not in desired]
        if keep:
            self._live[name] = keep
        else:
            self._live.pop(name, None)
        for mv in gone:
            await self._unload(mv)
        if not on_disk and not keep:
            self._status.pop(name, None)

    def _batch_callback(self, name: str) -> Callable | None:
        if self._on_batch is None:
            return None
        cb = self._on_batch

        def on_batch(rows: int, requests: int, waits: list[float]) -> None:
            cb(name, rows, requests, waits)

        return on_batch

    def _load(self, name: str, version: int, path: Path) -> ModelVersion:
        mv = ModelVersion(name, version, path, self.devices, fusion=self.fusion).load()
        mv.warmup(self.warmup_sizes)
        return mv

    async def _unload(self, mv: ModelVersion) -> None:
        self._set_status(mv.name, mv.version, VersionState.UNLOADING, mv=mv)
        await mv.close()
        self._set_status(mv.name, mv.version, VersionState.END, mv=mv)
        log.info(json.dumps({"event": "unloaded", "model": mv.name, "version": mv.version}))


def freeze_heap() -> int:
    """Collects every generation and freezes what survives (``gc.freeze``): the collector's
    later passes skip those objects. Objects frozen before are unfrozen first, so the objects of
    a version unloaded since are collected. Returns the number of frozen objects."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
