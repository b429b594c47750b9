"""bench.training.quality's MovieLens time split: the last 20% by time is the test file, and the
side table the schema joins is found wherever the data root was given from."""

from __future__ import annotations

import csv
from pathlib import Path

from bench.training.quality import time_split


def test_a_relative_data_root_still_links_the_side_table(tmp_path, monkeypatch):
    ml = tmp_path / "shared" / "data" / "movielens-latest-small"
    ml.mkdir(parents=True)
    (ml / "movies.csv").write_text("movieId,title,genres\n1,A,Drama\n")
    with (ml / "ratings.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["userId", "movieId", "rating", "timestamp"])
        w.writerows([[1, 1, 4.0, 100 - t] for t in range(10)])  # newest first
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    work = Path("work")
    data = time_split(Path("../shared/data"), work)
    out = work / "movielens_time"
    assert (out / "movies.csv").read_text().startswith("movieId,title")  # the link resolves
    with (out / "test.csv").open() as f:
        test = list(csv.reader(f))[1:]
    assert [int(r[3]) for r in test] == [99, 100]  # the two newest ratings
    assert data["test"] == [str(out / "test.csv")]
    # a second call keeps a working link
    time_split(Path("../shared/data"), work, recent_validation=0.1)
    assert (out / "movies.csv").exists()
