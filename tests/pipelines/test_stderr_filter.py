"""The ``stitchrec`` console entry drops TensorFlow's start-up noise and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from pipelines import stderr_filter
from pipelines.stderr_filter import is_noise

ROOT = Path(__file__).resolve().parents[2]

NOISE_LINES = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1796118734.313814   27356 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.",
    b"E0000 00:00:1796118748.182903   27356 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    b"CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    b"I0000 00:00:1796406802.393579   25736 port.cc:153] oneDNN custom operations are on. You may "
    b"see slightly different numerical results due to floating-point round-off errors from "
    b"different computation orders. To turn them off, set the environment variable "
    b"`TF_ENABLE_ONEDNN_OPTS=0`.",
]


def test_only_the_start_up_lines_are_noise():
    assert all(is_noise(line) for line in NOISE_LINES)
    for kept in (
        b"error: /data/x.tsv: line 2, column 'I4': value 'four' is not an integer",
        b"E0000 00:00:1796118748.182903   27356 some_kernel.cc:52] a real TensorFlow error",
        b"Traceback (most recent call last):",
        b"WARNING: something else",
    ):
        assert not is_noise(kept), kept


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, cwd=ROOT, timeout=300
    )


def test_the_filter_keeps_every_other_line_in_order_and_flushes_at_exit():
    code = (
        "import os, sys\n"
        "from pipelines.stderr_filter import filtered_stderr\n"
        f"noise = {NOISE_LINES!r}\n"
        "with filtered_stderr():\n"
        "    os.write(2, noise[0] + b'\\n')\n"
        "    print('kept 1', file=sys.stderr, flush=True)\n"
        "    os.write(2, noise[1] + b'\\n' + b'kept 2\\n' + noise[2] + b'\\n')\n"
        "    sys.stderr.write('kept 3 without a newline')\n"
        "print('stdout untouched')\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stderr.decode() == "kept 1\nkept 2\nkept 3 without a newline"
    assert out.stdout.decode() == "stdout untouched\n"


def test_a_child_process_holding_standard_error_does_not_hold_up_the_exit():
    code = (
        "import subprocess, sys, time\n"
        "from pipelines.stderr_filter import filtered_stderr\n"
        "with filtered_stderr():\n"
        "    child = subprocess.Popen(['sleep', '30'])  # inherits the filtered stderr\n"
        "    print('before the exit', file=sys.stderr, flush=True)\n"
        "    t0 = time.monotonic()\n"
        "print(f'{time.monotonic() - t0:.2f}')\n"
        "child.kill()\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stderr.decode() == "before the exit\n"
    assert float(out.stdout) < 1.0  # the exit drains the pipe; it does not wait for the child


def test_a_user_error_of_a_command_that_loads_tensorflow_is_one_line(tmp_path):
    code = (
        "import sys\n"
        "from pipelines import cli\n"
        f"sys.argv = ['stitchrec', 'evaluate', '--model', {str(tmp_path / 'none')!r}, "
        f"'--data', {str(tmp_path / 'none.csv')!r}]\n"
        "sys.exit(cli.entry())\n"
    )
    out = _run(code)
    assert out.returncode == 2
    lines = out.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines


def test_a_line_written_while_the_copier_waits_is_copied_at_exit(monkeypatch):
    """The copier's wait ends empty, then the block writes its last line and ends (``stop``)
    before the copier looks at ``stop`` again: the line still reaches standard error."""
    source, sink = os.pipe()
    out_read, out_write = os.pipe()
    stop = threading.Event()
    real_select = stderr_filter.select.select
    waits = []

    def racing_select(rlist, wlist, xlist, timeout=None):
        waits.append(timeout)
        if len(waits) == 1:  # the wait times out; meanwhile the block writes and ends
            os.write(sink, b"error: the last line\n")
            os.close(sink)
            stop.set()
            return [], [], []
        return real_select(rlist, wlist, xlist, timeout)

    monkeypatch.setattr(stderr_filter.select, "select", racing_select)
    stderr_filter._copy(source, out_write, stop)
    os.close(out_write)
    with os.fdopen(out_read, "rb") as copied:
        assert copied.read() == b"error: the last line\n"
