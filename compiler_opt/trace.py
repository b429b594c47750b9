"""A TensorFlow profiler trace of a block of code, parsed: ``with profiler_trace(level) as t:``.

Used to count what ran (op and XLA kernel events, ``compiler_opt/executed.py``) and what was
compiled (``compiler_opt.buckets.count_compilations``). Only one profiler session can run at a
time in a process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

try:  # the proto moved between TensorFlow releases
    from tsl.profiler.protobuf import xplane_pb2
except ImportError:  # pragma: no cover
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # type: ignore


@dataclasses.dataclass
class Trace:
    """``space``: the trace's ``XSpace`` (planes of lines of events), set when the block ends."""

    space: Any = None

    def event_names(self) -> Iterator[tuple[str, str, str]]:
        """``(plane name, line name, event name)`` of every event, in trace order."""
        for plane in self.space.planes:
            md = plane.event_metadata
            for line in plane.lines:
                for e in line.events:
                    yield plane.name, line.name, md[e.metadata_id].name


@contextlib.contextmanager
def profiler_trace(host_tracer_level: int) -> Iterator[Trace]:
    """Profiles the block (host tracer level 1: the runtime's and compilers' own events; 3: also
    every inexpensive op) into a temporary folder, parses the trace, removes the folder."""
    trace = Trace()
    folder = tempfile.mkdtemp(prefix="stitchrec-trace-")
    try:
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=host_tracer_level)
        tf.profiler.experimental.start(folder, options=options)
        try:
            yield trace
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(folder + "/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError(f"the profiler wrote no trace under {folder}")
        trace.space = xplane_pb2.XSpace()
        with open(files[0], "rb") as f:
            trace.space.ParseFromString(f.read())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
