"""The address of a tf.data service dispatcher, checked without TensorFlow (configs and flags
name it; ``features.tfrecord.service`` connects to it)."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"(grpc://)?(?P<host>[^\s:/]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})")


def service_address(text: str) -> str:
    """``"grpc://HOST:PORT"`` from ``HOST:PORT`` or ``grpc://HOST:PORT``.

    Raises:
      ValueError: ``text`` is not of that form (its port in 1..65535).
    """
    match = _ADDRESS.fullmatch(text.strip())
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(
            f"tf.data service address {text!r}: expected HOST:PORT or grpc://HOST:PORT of a "
            "dispatcher (`stitchrec data-service dispatcher`), e.g. grpc://127.0.0.1:5050"
        )
    return f"grpc://{match['host']}:{int(match['port'])}"
