"""bench/pcf_gnn run as a program (``--prepare-only``): the A/B split of the training rows and
the synthetic pair choice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.dataset import list_parquet

ROOT = Path(__file__).resolve().parents[2]


def _prepare(tmp: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "bench.pcf_gnn", "--datasets", "synthetic", "cost",
        "--synthetic-rows", "2000", "--graph-fraction", "0.3", "--prepare-only",
        "--work", str(tmp), "--out", str(tmp),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== cost: skipped (--prepare-only)" in proc.stdout
    return json.loads((tmp / "results.json").read_text())["prepared"]["synthetic"]


def _rows(folder: Path) -> list[tuple]:
    table = pa.concat_tables([pq.read_table(p) for p in list_parquet(folder)])
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("bench_pcf_gnn")
    return tmp, _prepare(tmp)


def test_split_is_disjoint_and_complete(prepared) -> None:
    tmp, ds = prepared
    train = _rows(tmp / "synthetic_2000" / "train")
    rows_a, rows_b = _rows(Path(ds["A"])), _rows(Path(ds["B"]))
    key = repr  # rows hold None (missing values): compare them by their text
    assert sorted(rows_a + rows_b, key=key) == sorted(train, key=key)
    assert 0.2 < len(rows_a) / len(train) < 0.4  # about 30% of the training rows
    again = _prepare(tmp)
    assert (again["A"], again["B"]) == (ds["A"], ds["B"]) and _rows(Path(ds["A"])) == rows_a


def test_synthetic_pairs_are_planted_plus_controls(prepared) -> None:
    tmp, ds = prepared
    truth = json.loads((tmp / "synthetic_2000" / "ground_truth.json").read_text())
    planted = [p["fields"] for p in truth["pairs"]]
    sizes = truth["vocab_sizes"]
    noise = sorted(truth["noise_fields"], key=lambda f: sizes[f])[:2]
    controls = [truth["triples"][0]["fields"][:2], noise]
    assert ds["planted"] == planted
    assert ds["pairs"] == planted + controls
    assert controls == [["C9", "C14"], ["C19", "C13"]]  # the default synthetic set, seed 0
    # the controls: a sub-pair of a planted triple and the two smallest noise fields
    assert (
        sizes[noise[0]]
        <= sizes[noise[1]]
        <= min(sizes[f] for f in truth["noise_fields"] if f not in noise)
    )
