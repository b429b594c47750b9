"""The server's side of ``serving.probes``: the heartbeat its event loop writes every
``BEAT_S`` seconds (ready as ``kserve.server_ready`` says), and the probe process it starts
with ``ServerOptions.probe_port``."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path

from serving.config import BindError, ServerOptions
from serving.kserve import server_ready
from serving.probes import BEAT_S, Heartbeat, ProbeProcess
from serving.rpc import ServerState


class ServerProbes:
    """The heartbeat of a running server (``options.heartbeat_file``, else a file in a folder
    of its own) and, with ``options.probe_port``, its probe process (``port``: the port it
    bound). Start with ``start``; ``stop`` writes a last beat (not ready), ends the process and
    removes the folder."""

    def __init__(self, state: ServerState, options: ServerOptions):
        self.state = state
        self.options = options
        self.port: int | None = None
        self._folder: str | None = None
        self._task: asyncio.Task | None = None
        self._process: ProbeProcess | None = None
        path = options.heartbeat_file
        if path is None:
            self._folder = tempfile.mkdtemp(prefix="stitchrec-heartbeat-")
            path = str(Path(self._folder) / "heartbeat")
        self.heartbeat = Heartbeat(path)

    async def start(self) -> None:
        """Starts the beats on the running loop, then the probe process (when asked for)."""
        self.heartbeat.beat(server_ready(self.state))
        self._task = asyncio.get_running_loop().create_task(self._beat())
        if self.options.probe_port is not None:
            host, port = self.options.probe_host, self.options.probe_port
            try:
                self._process = await asyncio.to_thread(
                    ProbeProcess, host, port, [self.heartbeat.path], self._folder
                )
            except OSError as e:
                raise BindError(f"cannot serve the probes on {host}:{port}: {e}") from None
            self.port = self._process.port

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            self.heartbeat.beat(server_ready(self.state))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.heartbeat.beat(False)
        if self._process is not None:
            await asyncio.to_thread(self._process.stop)
        self.heartbeat.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
