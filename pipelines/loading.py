"""Loading a command's modules with Python's cyclic garbage collector paused.

TensorFlow's import creates about 570,000 Python objects that live as long as the process. With
the collector on, importing a command's module (``stitchrec train``'s, the server's) runs about
five full collections, each walking every object loaded so far: 0.45 to 0.8 s of a 2.3 to 3 s
import on a 2-core machine. In a ``stitchrec`` process, ``loading_modules`` pauses the collector
while the modules load, then freezes what they created (``gc.freeze``: the collector's later
passes skip those objects, so a training run's or a server's full collections walk only what it
allocates itself) and turns the collector back on.

A cycle that became garbage during the import is frozen with the rest (about 2,000 to 3,000
objects, once per process); the server's heap freeze (``serving.repository.freeze_heap``)
unfreezes, collects and freezes again at its first load, which frees them. Only the process's
entry point turns this on (``pause_collector_when_loading``, called by the ``stitchrec``
script): a program that calls ``pipelines.cli.main`` itself (a test, a notebook) keeps its
collector as it is, since a freeze there would also keep whatever garbage it had pending.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_PAUSE = {"on": False}


def pause_collector_when_loading() -> None:
    """Makes ``loading_modules`` pause the collector and freeze for the rest of the process (for
    the process's entry point only)."""
    _PAUSE["on"] = True


@contextlib.contextmanager
def loading_modules() -> Iterator[None]:
    """The ``with`` block (imports) runs with the collector paused, then every object tracked so
    far is frozen and the collector's state restored (on, unless it was off before); outside a
    process whose entry point called ``pause_collector_when_loading``, nothing changes."""
    if not _PAUSE["on"]:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
