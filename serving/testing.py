"""Helpers for exercising the server in tests and benchmarks (no pytest dependency).

- ``ServerThread``: a real server on ``127.0.0.1:0`` running on a background thread's event
  loop, for synchronous clients; ``wait_serving(target)`` waits for grpc.health.v1 SERVING (a
  server in another process); ``wait_until(cond)`` polls a condition.
- A hand-checkable SavedModel with the export contract (raw features by name -> ``score``,
  ``logit``)::

      logit = bias + 0.5 * price + 1.0 * [item == 3] + 2.0 * [user == "u1"]
      score = sigmoid(logit)

  ``user`` is a user-group feature, ``item`` and ``price`` item-group features. Versions differ
  in ``bias`` so a caller can tell which version answered: ``write_linear_model`` writes it,
  ``reference_logit`` / ``reference_score`` compute it by hand, ``features`` builds the numpy
  inputs, ``copy_version`` copies a version into a repository atomically; ``set_traffic`` writes a
  model's ``traffic.toml`` and waits until the server routes by it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.config import ServerOptions
from serving.server import ServingServer, create_server
from serving.traffic import TRAFFIC_FILE, parse_traffic
from serving.version_files import atomic_dir

# --------------------------------------------------------------------------------------------
# servers


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
        """Runs ``coro`` on the server's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> concurrent.futures.Future:
        """Schedules ``coro`` on the server's loop without waiting."""
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


def serve_process(*args: str) -> tuple[subprocess.Popen, dict[str, Any]]:
    """``stitchrec serve ARGS`` in a child process (this checkout first on its PYTHONPATH,
    standard output piped) and the JSON line it prints once serving."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "pipelines.cli", "serve", *args]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    try:
        return proc, json.loads(proc.stdout.readline())
    except ValueError:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"stitchrec serve {' '.join(args)} printed no JSON line") from None


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    """Polls ``cond()`` every 50 ms until it is true; TimeoutError after ``timeout`` seconds."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"condition not reached in {timeout} s")
        time.sleep(0.05)


def wait_serving(target: str, timeout: float = 60) -> None:
    """Waits until grpc.health.v1 at ``target`` (``host:port``) reports SERVING."""
    t0 = time.monotonic()
    while True:
        try:
            stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{target} not serving after {timeout}s")
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------
# the linear model

SCHEMA = """
name = "linear"

[source]
format = "parquet"

[[fields]]
name = "user"
kind = "categorical"
group = "user"

[[fields]]
name = "item"
kind = "categorical"
dtype = "int64"
group = "item"

[[fields]]
name = "price"
kind = "numeric"
group = "item"
"""


def reference_logit(bias: float, user: str, item: int, price: float) -> float:
    """The linear model's logit, by hand."""
    return bias + 0.5 * price + 1.0 * (item == 3) + 2.0 * (user == "u1")


def reference_score(bias: float, user: str, item: int, price: float) -> float:
    """The linear model's score (sigmoid of ``reference_logit``), by hand."""
    return 1.0 / (1.0 + math.exp(-reference_logit(bias, user, item, price)))


class _Linear(tf.Module):
    def __init__(self, bias: float):
        super().__init__()
        self.bias = tf.Variable(bias, dtype=tf.float32)

    def _logit(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> tf.Tensor:
        return (
            self.bias
            + 0.5 * price
            + tf.cast(tf.equal(item, 3), tf.float32)
            + 2.0 * tf.cast(tf.equal(user, "u1"), tf.float32)
        )

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="user"),
            tf.TensorSpec([None], tf.int64, name="item"),
            tf.TensorSpec([None], tf.float32, name="price"),
        ]
    )
    def serve(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> dict[str, tf.Tensor]:
        logit = self._logit(user, item, price)
        return {"score": tf.sigmoid(logit), "logit": logit}

    @tf.function(
        input_signature=[
            tf.TensorSpec([1], tf.string, name="user"),
            tf.TensorSpec([None], tf.int64, name="item"),
            tf.TensorSpec([None], tf.float32, name="price"),
        ]
    )
    def rank(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> dict[str, tf.Tensor]:
        n = tf.shape(item)[0]
        logit = self._logit(tf.repeat(user, n), item, price)
        # a cascade would prune here; this model marks the path with +10 on the logit
        return {"score": tf.sigmoid(logit + 10.0), "logit": logit + 10.0}


def write_linear_model(path: str | Path, bias: float, rank_signature: bool = False) -> Path:
    """Writes the SavedModel (with assets.extra and the completion marker like `stitchrec
    export`, ``serving.version_files.atomic_dir``) to ``path``; with ``rank_signature`` it also
    has a ``rank_request`` signature (one user, N candidates)."""
    path = Path(path)
    module = _Linear(bias)
    sigs = {"serving_default": module.serve}
    if rank_signature:
        sigs["rank_request"] = module.rank
    with atomic_dir(path) as tmp:
        tf.saved_model.save(module, str(tmp), signatures=sigs)
        extra = tmp / "assets.extra"
        extra.mkdir(exist_ok=True)
        (extra / "schema.toml").write_text(SCHEMA)
        (extra / "stitchrec.json").write_text(
            json.dumps({"model": "linear", "inputs": ["user", "item", "price"], "bias": bias})
        )
    return path


def copy_version(src: Path, dst_root: Path, version: int) -> Path:
    """Copies a SavedModel folder in as ``dst_root/<version>`` atomically (hidden temporary
    name + rename)."""
    tmp = dst_root / f".tmp-{version}"
    shutil.copytree(src, tmp)
    final = dst_root / str(version)
    tmp.rename(final)
    return final


def features(users: list[str], items: list[int], prices: list[float]) -> dict[str, np.ndarray]:
    """The linear model's inputs as numpy arrays (strings as bytes objects)."""
    return {
        "user": np.array([u.encode() for u in users], dtype=object),
        "item": np.array(items, dtype=np.int64),
        "price": np.array(prices, dtype=np.float32),
    }


def write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def set_traffic(server: ServerThread, root: Path, model: str, text: str) -> None:
    """Writes ``root/model/traffic.toml`` atomically (a temporary file renamed over it) and
    waits until ``server`` routes by it."""
    write_atomic(Path(root) / model / TRAFFIC_FILE, text)
    want = parse_traffic(text)
    wait_until(lambda: server.server.state.traffic.config(model) == want, timeout=10)
