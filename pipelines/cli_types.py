"""argparse value types of the ``stitchrec`` flags: each converts one flag's text or raises
``argparse.ArgumentTypeError`` saying what was expected, so the parser refuses the value with its
usage line and one error line (exit status 2) before any work starts."""

from __future__ import annotations

import argparse
import math


def int_list(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)`` (an argparse type)."""
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def positive(text: str) -> int:
    """An integer >= 1 (an argparse type)."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return v


def non_negative_int(text: str) -> int:
    """An integer >= 0 (an argparse type)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (an argparse type)."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def share(text: str) -> float:
    """A number in [0, 1] (an argparse type)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return v


def split_share(text: str) -> float:
    """A number in [0, 1): the share of rows a split takes (an argparse type)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return v


def non_negative(text: str) -> float:
    """A finite number >= 0 (an argparse type)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535 (an argparse type)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {text}")
    return v


def message_mb(text: str) -> float:
    """A message size in MiB: a number > 0 and at most 2047 (gRPC counts bytes in an int32)."""
    v = positive_float(text)
    if v * 1024 * 1024 >= 2**31:
        raise argparse.ArgumentTypeError(f"expected at most 2047 MiB (gRPC's limit), got {text!r}")
    return v


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2**32) (an argparse type)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32), got {text!r}")
    return v
