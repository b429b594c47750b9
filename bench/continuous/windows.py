"""The bench's daily windows: one folder per day with a shared schema, train and test shards.

``Windows`` is what every arm reads; ``WINDOW_SOURCES`` maps a ``--datasets`` name to the
function writing (or reading back) that dataset's windows for one seed. ``synthetic`` is
``features.synthetic_days`` (its ``days.json`` adds each day's oracle AUC).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from features.schema import load_schema
from features.synthetic_config import SyntheticConfig
from features.synthetic_days import write_days
from features.synthetic_days_config import ITEM, DaysConfig, day_name


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


#: ``--datasets`` name -> the function giving that dataset's windows for one seed.
WINDOW_SOURCES: dict[str, Callable[[Path, int, Any], Windows]] = {"synthetic": synthetic_windows}


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
