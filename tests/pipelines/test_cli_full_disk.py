"""A write that fails for a full disk, a quota or the file size limit ends in one ``error:`` line
(exit 2), not a traceback."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

from features.read_report import DataError
from pipelines.cli import full_disk_message
from tests.testdata import TINY_SCHEMA, make_tiny_table

ROOT = Path(__file__).resolve().parents[2]


def _file_size_limit(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_convert_past_the_file_size_limit_is_one_error_line(tmp_path):
    make_tiny_table(5000).to_pandas().to_csv(tmp_path / "log.csv", index=False)  # 140 kB
    (tmp_path / "schema.toml").write_text(TINY_SCHEMA.replace('"parquet"', '"csv"'))
    argv = ["convert", "--schema", str(tmp_path / "schema.toml"), "--input"]
    argv += [str(tmp_path / "log.csv"), "--output", str(tmp_path / "pq")]
    r = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_file_size_limit(20_000),
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2, r.stderr
    assert len(errors) == 1 and "File too large" in errors[0], r.stderr
    assert f"under {tmp_path / 'pq'}" in errors[0] and "Traceback" not in r.stderr


def test_full_disk_message_names_the_file_and_only_fits_full_disks():
    full = OSError(errno.ENOSPC, "No space left on device", "/runs/a/stats/stats.json")
    assert full_disk_message(full).startswith(
        "writing /runs/a/stats/stats.json: No space left on device; free disk space"
    )
    quota = DataError("reading failed")
    quota.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert full_disk_message(quota, "out").startswith("writing under out: Disk quota exceeded;")
    checkpoint = tf.errors.UnknownError(
        None,
        None,
        "{{function_node __wrapped__SaveV2_dtypes_3_device_/job:localhost/replica:0/task:0/"
        "device:CPU:0}} /runs/a/checkpoints/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001"
        ".tempstate1; File too large [Op:SaveV2]",
    )
    assert full_disk_message(checkpoint).startswith(
        "writing /runs/a/checkpoints/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001"
        ".tempstate1: File too large; "
    )
    assert full_disk_message(OSError(errno.ENOENT, "No such file or directory", "x")) is None
    assert full_disk_message(tf.errors.ResourceExhaustedError(None, None, "OOM")) is None
    assert full_disk_message(ValueError("No space left on device")) is None
