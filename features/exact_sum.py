"""``ExactSum``: a sum of floats that does not depend on the order the terms are added in.

A float sum rounds at every addition, so partial sums merged in another grouping (tasks merged
along another tree, or folded one by one) can differ in the last bits. ``ExactSum`` keeps the
exact sum as a short list of non-overlapping floats (Shewchuk, "Adaptive Precision
Floating-Point Arithmetic and Fast Robust Geometric Predicates", 1997: the partials of Python's
``math.fsum``) and rounds once, in ``value``: every order and grouping of the same terms gives
the same ``value``, the correctly rounded sum. The list stays short (a few floats for terms of
similar magnitude; at most about 40 for any float64 terms).

Non-finite terms (inf, nan) are kept apart and decide ``value`` as IEEE addition would: nan if
any term is nan or infinities of both signs were added, else the infinity.
"""

from __future__ import annotations

import math


class ExactSum:
    """The exact sum of the floats added; ``value`` is its correctly rounded float.

    >>> a, b = ExactSum(), ExactSum()
    >>> a.add(1e16); a.add(1.0); b.add(-1e16); b.add(1.0)
    >>> a.merge(b); a.value
    2.0
    """

    __slots__ = ("partials", "special")

    def __init__(self) -> None:
        self.partials: list[float] = []
        self.special = 0.0  # the sum of the non-finite terms (0.0 while there are none)

    def add(self, x: float) -> None:
        """Adds the term ``x``."""
        x = float(x)
        if not math.isfinite(x):
            self.special += x
            return
        kept = []
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                kept.append(lo)
            x = hi
        if math.isinf(x):  # the finite terms overflowed: exact no more, as IEEE addition
            self.special += x
            self.partials = []
            return
        kept.append(x)
        self.partials = kept

    def merge(self, other: ExactSum) -> None:
        """Adds every term ``other`` has seen."""
        for p in other.partials:
            self.add(p)
        self.special += other.special

    @property
    def value(self) -> float:
        """The correctly rounded sum of every term added (0.0 when none)."""
        if self.special:  # an infinity, or nan (true as well)
            return self.special
        return math.fsum(self.partials)
