"""`stitchrec convert` completes its output folder or leaves none; training refuses unfinished
conversions and reads bad Parquet rows like raw ones (one error line, or skipped and counted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import DataError
from features.readers import list_files
from pipelines.cli import main
from tests.testdata import make_tiny_table, write_run_config, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
ROW = "1\t5\t\t3\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9" + "\tab" * 26


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _convert(capsys, tsv: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    argv = ["convert", "--schema", "criteo", "--input", str(tsv), "--output", str(out)]
    return _run(capsys, *argv, *extra)


def test_convert_writes_its_markers_and_replaces_only_its_own_folders(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    tsv.write_text("\n".join([ROW] * 20) + "\n")
    out = tmp_path / "pq"
    rc, _, _ = _convert(capsys, tsv, out, "--test-fraction", "0.5")
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS",
        "convert.json",
        "schema.toml",
        "test",
        "train",
    ]
    assert json.loads((out / "_SUCCESS").read_text())["rows"] == 20
    assert json.loads((out / "convert.json").read_text())["test_fraction"] == 0.5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    rc, _, _ = _convert(capsys, tsv, out)  # an earlier convert's folder is replaced
    assert rc == 0 and not (out / "test").exists() and (out / "_SUCCESS").exists()
    (out / "notes.txt").write_text("mine")
    rc, _, err = _convert(capsys, tsv, out)
    assert rc == 2 and err.startswith("error: --output") and "['notes.txt']" in err
    assert (out / "notes.txt").read_text() == "mine"
    bad = tmp_path / "bad.tsv"
    bad.write_text(ROW.replace("\t5\t", "\tfive\t", 1) + "\n")
    rc, _, err = _convert(capsys, bad, tmp_path / "new")
    assert rc == 2 and "line 1" in err and not (tmp_path / "new").exists()
    assert not (tmp_path / ".new.converting").exists()


_KILLED = """
import os, signal, sys
from features import completion
from pipelines.cli import main
completion.mark_complete = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_convert_leaves_no_complete_looking_folder(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    tsv.write_text("\n".join([ROW] * 20) + "\n")
    out = tmp_path / "pq"
    argv = ["convert", "--schema", "criteo", "--input", str(tsv), "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", _KILLED, *argv], env=env, cwd=ROOT, check=False)
    assert p.returncode == -9  # killed after every shard and schema.toml, before _SUCCESS
    assert not out.exists()
    left = tmp_path / ".pq.converting"
    assert (left / "convert.json").exists() and (left / "schema.toml").exists()
    for read in (list_files,):
        with pytest.raises(DataError, match=r"unfinished conversion.*no _SUCCESS"):
            read(left / "train")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'output_dir = "run"\n[data]\nschema = "{left}/schema.toml"\ntrain = "{left}/train"\n'
    )
    rc, _, err = _run(capsys, "train", "--config", str(cfg))
    assert rc == 2 and err.count("\n") == 1 and "unfinished conversion" in err, err
    rc, _, err = _run(capsys, "train", "--config", str(cfg), "--max-bad-rows", "3")
    assert rc == 2 and "unfinished conversion" in err, err
    assert _convert(capsys, tsv, out)[0] == 0 and not left.exists()


def test_bad_rows_of_direct_parquet_training_input(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=700, train_rows=600)
    t = make_tiny_table(600)
    price = [str(v) for v in t.column("price").to_pylist()]
    price[4] = "many"
    t = t.set_column(t.column_names.index("price"), "price", pa.array(price))
    (data["train"] / "part-00000.parquet").unlink()
    pq.write_table(t, data["train"] / "part-00000.parquet")
    cfg = write_run_config(
        tmp_path / "c.toml", data, tmp_path / "run", {"type": "lr"}, {"batch_size": 64}
    )
    rc, _, err = _run(capsys, "train", "--config", str(cfg), "--set", "train.max_steps=2")
    assert rc == 2 and err.count("\n") == 1, err
    assert "part-00000.parquet" in err and "row 5" in err and "'price'" in err and "'many'" in err
    rc, out, _ = _run(capsys, "train", "--config", str(cfg), "--max-bad-rows", "1")
    assert rc == 0 and "skipped 1 bad rows" in out, out
