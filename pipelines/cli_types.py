"""argparse value types of the ``stitchrec`` flags: each converts one flag's text or raises
``argparse.ArgumentTypeError`` saying what was expected, so the parser refuses the value with its
usage line and one error line (exit status 2) before any work starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)


def _checked(text: str, convert: Callable[[str], T], ok: Callable[[T], bool], expected: str) -> T:
    """``convert(text)`` when it converts and ``ok`` accepts it, else ``ArgumentTypeError``
    ("expected ``expected``, got ``text``")."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


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
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (an argparse type)."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2**32) (an argparse type)."""
    return _checked(text, int, lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)")


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535 (an argparse type)."""
    return _checked(text, int, lambda v: 0 <= v <= 65535, "a port in [0, 65535]")


def positive_float(text: str) -> float:
    """A finite number > 0 (an argparse type)."""
    return _checked(text, float, lambda v: 0 < v < math.inf, "a number > 0")


def non_negative(text: str) -> float:
    """A finite number >= 0 (an argparse type)."""
    return _checked(text, float, lambda v: 0 <= v < math.inf, "a finite number >= 0")


def share(text: str) -> float:
    """A number in [0, 1] (an argparse type)."""
    return _checked(text, float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def split_share(text: str) -> float:
    """A number in [0, 1): the share of rows a split takes (an argparse type)."""
    return _checked(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def message_mb(text: str) -> float:
    """A message size in MiB: a number > 0 and at most 2047 (gRPC counts bytes in an int32)."""
    v = positive_float(text)
    if v * 1024 * 1024 >= 2**31:
        raise argparse.ArgumentTypeError(f"expected at most 2047 MiB (gRPC's limit), got {text!r}")
    return v
