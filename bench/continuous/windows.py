"""The bench's daily windows: one folder per day with a shared schema, train and test shards.

``Windows`` is what every arm reads; ``WINDOW_SOURCES`` maps a ``--datasets`` name to the
function writing (or reading back) that dataset's windows for one seed. ``synthetic`` is
``features.synthetic_days`` (its ``days.json`` adds each day's oracle AUC). ``movielens`` is
MovieLens ml-latest-small under ``--data-root``: its ratings cut by year (``stitchrec windows
--by year --min-rows 5000``: 12 windows, 1996 to 2018), each window's ratings split into train
and test shards (a fifth of the rows by hash of the seed and row, ``features.convert``) with the
shipped ``movielens`` schema; a "day" of the bench is one of those windows (the first
``--days``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from features.convert import convert
from features.schema import load_schema, shipped_schemas
from features.synthetic_config import SyntheticConfig
from features.synthetic_days import write_days
from features.synthetic_days_config import ITEM, DaysConfig, day_name
from features.windows import WindowSpec, cut_windows

#: ``movielens``: windows under this many ratings merge into the next (``WindowSpec.min_rows``)
MOVIELENS_MIN_ROWS = 5_000


class Windows(NamedTuple):
    """A dataset cut into days: ``schema`` (the same for every day), per day its ``train`` and
    ``test`` shard folders, the label column, the item field (the one ``max_vocab`` caps in the
    eviction arm) and per day the AUC ceiling where known."""

    name: str
    schema: Path
    train: list[Path]
    test: list[Path]
    label: str
    item: str
    oracle_auc: list[float | None]

    @property
    def days(self) -> int:
        return len(self.train)


def synthetic_windows(work: Path, seed: int, args: Any) -> Windows:
    """``--days`` synthetic days of ``--rows`` rows (seed ``seed``), written once under ``work``
    (a longer run's days there are read back: their first ``--days`` days)."""
    out = work / f"synthetic_days_seed{seed}"
    if not (out / "days.json").exists():
        config = DaysConfig(
            base=SyntheticConfig(rows=args.rows, seed=seed),
            days=args.days,
            items=args.items,
            users=args.users,
            item_churn=args.item_churn,
            user_churn=args.user_churn,
            drift=args.drift,
        )
        write_days(config, out)
    report = json.loads((out / "days.json").read_text())
    want = {"rows_per_day": args.rows, "items": args.items, "users": args.users}
    want |= {"item_churn": args.item_churn, "user_churn": args.user_churn, "drift": args.drift}
    differ = {k: (report[k], v) for k, v in want.items() if report[k] != v}
    if differ or report["days"] < args.days:
        raise ValueError(
            f"{out} holds {report['days']} days written with other settings {differ} "
            f"(there, here): expected at least {args.days} days of these; use another --work"
        )
    days = report["windows"][: args.days]  # the first days of a longer run are the same days
    folders = [out / day_name(d) for d in range(len(days))]
    return Windows(
        name="synthetic",
        schema=folders[0] / "schema.toml",
        train=[f / "train" for f in folders],
        test=[f / "test" for f in folders],
        label="label",
        item=ITEM,
        oracle_auc=[w["oracle_auc"] for w in days],
    )


def movielens_windows(work: Path, seed: int, args: Any) -> Windows:
    """MovieLens ratings by year (the module docstring), written once under ``work``: the cut
    shared by every seed, each seed's train / test shards apart."""
    ratings = Path(args.data_root) / "movielens-latest-small" / "ratings.csv"
    if not ratings.exists():
        raise FileNotFoundError(f"movielens: {ratings} does not exist (--data-root)")
    cut = work / "movielens_by_year"
    if not (cut / "windows.json").exists():
        cut_windows(ratings, cut, WindowSpec(by="year", min_rows=MOVIELENS_MIN_ROWS))
    found = json.loads((cut / "windows.json").read_text())["windows"][: args.days]
    out = work / f"movielens_windows_seed{seed}"
    schema = load_schema(shipped_schemas()["movielens"])
    if not (out / "schema.toml").exists():
        for d, window in enumerate(found):
            folder = cut / window["folder"]
            movies = folder / "movies.csv"  # the schema joins movies.csv beside each ratings file
            if not movies.exists():
                movies.symlink_to(ratings.parent / "movies.csv")
            convert(
                schema, folder / "part-00000.csv", out / day_name(d), test_fraction=0.2, seed=seed
            )
        schema.as_parquet().save(out / "schema.toml")  # last: the windows are complete
    folders = [out / day_name(d) for d in range(len(found))]
    return Windows(
        name="movielens",
        schema=out / "schema.toml",
        train=[f / "train" for f in folders],
        test=[f / "test" for f in folders],
        label="label",
        item="movieId",
        oracle_auc=[None] * len(folders),
    )


#: ``--datasets`` name -> the function giving that dataset's windows for one seed.
WINDOW_SOURCES: dict[str, Callable[[Path, int, Any], Windows]] = {
    "synthetic": synthetic_windows,
    "movielens": movielens_windows,
}


def capped_schema(windows: Windows, field: str, max_vocab: int, out: Path) -> Path:
    """A copy of the windows' schema whose ``field`` has ``max_vocab`` (written once)."""
    if not out.exists():
        schema = load_schema(windows.schema)
        fields = tuple(
            dataclasses.replace(f, max_vocab=max_vocab) if f.name == field else f
            for f in schema.fields
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        dataclasses.replace(schema, fields=fields).save(out)
    return out
