"""The command line: user errors print one clear line and exit 2; commands write what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main

CRITEO_ROWS = [
    "1\t5\t\t3\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9" + "\tab" * 26,
    "0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" + "\tcd" * 26,
]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _convert(capsys, tsv, out, *extra: str) -> tuple[int, str, str]:
    return _run(
        capsys, "convert", "--schema", "criteo", "--input", str(tsv), "--output", str(out), *extra
    )


def test_convert_and_stats_on_criteo_tsv(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    tsv.write_text("\n".join(CRITEO_ROWS * 10) + "\n")
    rc, out, _ = _convert(capsys, tsv, tmp_path / "pq")
    assert rc == 0 and "rows: 20" in out
    assert (tmp_path / "pq" / "schema.toml").exists()
    rc, out, _ = _run(
        capsys,
        "stats",
        "--schema",
        "criteo",
        "--input",
        str(tsv),
        "--output",
        str(tmp_path / "stats"),
    )
    assert rc == 0 and "label mean: 0.5000" in out
    stats = json.loads((tmp_path / "stats" / "stats.json").read_text())
    assert stats["fields"]["I2"]["missing"] == 10


def test_bad_row_is_an_error_naming_file_line_and_column(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    bad = CRITEO_ROWS[1].replace("\t4\t", "\tfour\t", 1)
    tsv.write_text("\n".join([CRITEO_ROWS[0], bad, CRITEO_ROWS[0]]) + "\n")
    rc, _, err = _convert(capsys, tsv, tmp_path / "pq")
    assert rc == 2
    assert err.startswith("error: ") and "day.tsv" in err and "line 2" in err and "I4" in err
    rc, out, _ = _convert(capsys, tsv, tmp_path / "pq", "--max-bad-rows", "1")
    assert rc == 0 and "rows: 2; bad rows skipped: 1" in out


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ('output_dir = "x"\n[data]\nschema = "nope.toml"\ntrain = ["t"]\n', "does not exist"),
        (
            'output_dir = "x"\n[data]\nschema = "criteo"\ntrain = ["t"]\n[train]\nbatch = 3\n',
            "unknown keys ['batch']",
        ),
        ('output_dir = "x"\n[data]\nschema = "criteo"\n', "either `raw` files or `train`"),
    ],
)
def test_train_config_errors(tmp_path, capsys, config, match):
    (tmp_path / "c.toml").write_text(config)
    rc, _, err = _run(capsys, "train", "--config", str(tmp_path / "c.toml"))
    assert rc == 2 and match in err


def test_export_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    rc, _, err = _run(capsys, "export", "--run", str(tmp_path))
    assert rc == 2 and "not a training run" in err


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "stitchrec"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("demo", "generate", "convert", "stats", "train", "export", "evaluate"):
        assert command in out


def test_train_from_raw_csv_skips_counted_bad_rows(tmp_path, capsys):
    from tests.testdata import TINY_SCHEMA, make_tiny_table

    df = make_tiny_table(600).to_pandas()
    df.to_csv(tmp_path / "log.csv", index=False)
    lines = (tmp_path / "log.csv").read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",7"  # label 7 on line 4
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "schema.toml").write_text(
        TINY_SCHEMA.replace('format = "parquet"', 'format = "csv"')
    )
    (tmp_path / "c.toml").write_text(
        'output_dir = "run"\n[data]\nschema = "schema.toml"\nraw = ["log.csv"]\n'
        '[model]\ntype = "lr"\n[train]\nbatch_size = 64\nmax_steps = 3\n'
    )
    rc, _, err = _run(capsys, "train", "--config", str(tmp_path / "c.toml"))
    assert rc == 2 and "log.csv" in err and "line 4" in err and "label" in err
    rc, out, _ = _run(capsys, "train", "--config", str(tmp_path / "c.toml"), "--max-bad-rows", "1")
    assert rc == 0 and "skipped 1 bad rows" in out and "test auc" in out
    run = tmp_path / "run"
    assert run.is_dir()
    rc, _, err = _run(capsys, "export", "--run", str(run), "--fuse", "--fuse-ladder", "64,8")
    assert rc == 2 and "ladder[1]=8 is not larger than ladder[0]=64" in err
    assert not (run / "export").exists() or not any((run / "export").iterdir())
    rc, out, _ = _run(capsys, "export", "--run", str(run), "--fuse", "--fuse-ladder", "8,64")
    assert rc == 0 and "fusion:" in out
    spec = json.loads(next(run.glob("export/*/assets.extra/fusion.json")).read_text())
    assert spec["ladder"] == [8, 64] and spec["realization"] == "xla_clusters"
