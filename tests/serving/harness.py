"""A real server on 127.0.0.1:0 running in a background thread's event loop, for sync clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

from serving.server import ServerOptions, ServingServer, create_server


class ServerThread:
    """Starts ``create_server`` on its own event loop; ``stop()`` stops it gracefully."""

    def __init__(self, repo: str | Path, options: ServerOptions | None = None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: ServingServer
        self.server, self.port = self.call(create_server("127.0.0.1:0", repo, options))
        self.target = f"127.0.0.1:{self.port}"

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, grace: float = 5.0) -> None:
        try:
            self.call(self.server.stop(grace))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
