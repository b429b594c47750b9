"""bench/pcf_gnn helpers: the A/B split of the training rows and the synthetic pair choice."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.pcf_gnn.__main__ import _split_train, _synthetic_pairs


def test_split_is_disjoint_and_complete(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    pq.write_table(pa.table({"row": list(range(1000))}), tmp_path / "train" / "part-0.parquet")
    pq.write_table(
        pa.table({"row": list(range(1000, 1500))}), tmp_path / "train" / "part-1.parquet"
    )
    a, b = _split_train(tmp_path / "train", tmp_path / "split", 0.3, seed=0)
    rows_a = pq.read_table(a).column("row").to_pylist()
    rows_b = pq.read_table(b).column("row").to_pylist()
    assert sorted(rows_a + rows_b) == list(range(1500))
    assert 350 < len(rows_a) < 550  # about 30% of 1,500
    again = _split_train(tmp_path / "train", tmp_path / "split", 0.3, seed=0)
    assert again == (a, b) and pq.read_table(a).column("row").to_pylist() == rows_a


def test_synthetic_pairs_are_planted_plus_controls() -> None:
    truth = {
        "pairs": [{"fields": ["C2", "C5"]}, {"fields": ["C8", "C25"]}],
        "triples": [{"fields": ["C9", "C14", "C17"]}],
        "noise_fields": ["C4", "C13", "C19"],
        "vocab_sizes": {"C4": 50_000, "C13": 3_000, "C19": 2_000},
    }
    planted, controls = _synthetic_pairs(truth)
    assert planted == [("C2", "C5"), ("C8", "C25")]
    assert controls == [("C9", "C14"), ("C19", "C13")]
