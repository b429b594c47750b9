"""The flags of the data commands ``generate``, ``convert``, ``stats``, ``add-history``,
``windows`` and ``predict``
(``pipelines.cli_args`` describes how a command's flags and handler are declared)."""

from __future__ import annotations

import argparse

from pipelines.cli_args import (
    Subparsers,
    _bad_rows,
    _raw_input,
    chunk_flag,
    engine_flags,
)
from pipelines.cli_types import non_negative, port, positive, share, split_share


def generate(sub: Subparsers) -> None:
    g = sub.add_parser("generate", help="write the synthetic Criteo-layout dataset")
    g.add_argument(
        "--output",
        required=True,
        help="folder for train/ and test/ Parquet shards, schema.toml and ground_truth.json "
        "(new or empty; an earlier generate output there is replaced whole)",
    )
    g.add_argument("--rows", type=positive, default=1_000_000, help="rows to generate")
    g.add_argument("--seed", type=int, default=0, help="seed of the generator")
    g.add_argument("--test-fraction", type=split_share, default=0.2, help="share of rows in test/")
    g.add_argument(
        "--criteo-tsv", action="store_true", help="also write train.tsv in Criteo layout"
    )
    g.add_argument(
        "--sequences",
        action="store_true",
        help="add the target item, its category and the behaviour sequences hist_items and "
        "hist_cats, with a planted history x target click effect",
    )
    g.add_argument(
        "--conversion",
        action="store_true",
        help="add the label buy, defined on the clicked rows (0 where label is 0)",
    )
    _generate_days(g)
    g.set_defaults(handler="pipelines.data_commands:cmd_generate")


def _generate_days(g: argparse.ArgumentParser) -> None:
    d = g.add_argument_group(
        "daily windows",
        "with --days N: OUTPUT/day-000 .. day-{N-1}, each laid out like one generate output "
        "(--rows rows a day), with churning item and user fields and drifting weights, and "
        "OUTPUT/days.json",
    )
    d.add_argument("--days", type=positive, default=None, help="number of daily windows")
    d.add_argument(
        "--item-churn",
        type=share,
        default=None,
        help="share of the active items retired (and as many born) each day (default 0.05)",
    )
    d.add_argument(
        "--user-churn",
        type=share,
        default=None,
        help="share of the active users retired (and as many born) each day (default 0.02)",
    )
    d.add_argument(
        "--drift",
        type=non_negative,
        default=None,
        help="daily random-walk step of the other fields' weights, relative to their scale "
        "(default 0.05; 0: no drift)",
    )
    d.add_argument(
        "--items", type=positive, default=None, help="active items per day (default 10,000)"
    )
    d.add_argument(
        "--users", type=positive, default=None, help="active users per day (default 100,000)"
    )


def convert(sub: Subparsers) -> None:
    c = sub.add_parser("convert", help="raw files -> Parquet shards (optionally split)")
    _raw_input(c)
    c.add_argument("--output", required=True, help="folder for the shards and schema.toml")
    c.add_argument(
        "--test-fraction",
        type=split_share,
        default=0.0,
        help="share of rows written to a test split (0: one train split)",
    )
    c.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    _bad_rows(c)
    engine_flags(c)
    chunk_flag(c)
    c.set_defaults(handler="pipelines.data_commands:cmd_convert")


def stats(sub: Subparsers) -> None:
    s = sub.add_parser("stats", help="vocabularies and numeric statistics in one pass")
    _raw_input(s)
    s.add_argument(
        "--output",
        required=True,
        help="folder for stats.json and vocab/ (new or empty; an earlier stats output there is "
        "replaced whole)",
    )
    _bad_rows(s)
    engine_flags(s)
    chunk_flag(s)
    s.set_defaults(handler="pipelines.data_commands:cmd_stats")


def add_history(sub: Subparsers) -> None:
    h = sub.add_parser(
        "add-history",
        help="add each row's previous items of the same user (a behaviour sequence) to a CSV log",
        description="Writes the rows of a CSV log plus the user's previous items (strictly "
        "earlier timestamps, newest first, joined with '|') as a new column, atomically.",
    )
    h.add_argument("--input", required=True, help="CSV log with a header row")
    h.add_argument("--output", required=True, help="CSV file to write (replaced when it exists)")
    h.add_argument("--user", default="userId", help="user column (default userId)")
    h.add_argument("--item", default="movieId", help="item column (default movieId)")
    h.add_argument("--time", default="timestamp", help="timestamp column (default timestamp)")
    h.add_argument(
        "--length", type=positive, default=20, help="previous items kept per row (default 20)"
    )
    h.add_argument("--column", default=None, help="history column name (default hist_<item>)")
    h.add_argument(
        "--attributes",
        default=None,
        help="CSV side table keyed by the item column (e.g. movies.csv) for --attribute",
    )
    h.add_argument(
        "--attribute",
        default=None,
        help="a column of --attributes: writes <attribute>_first (the row item's first '|' "
        "value) and hist_<attribute>_first (aligned with the history)",
    )
    h.set_defaults(handler="pipelines.data_commands:cmd_add_history")


def windows(sub: Subparsers) -> None:
    w = sub.add_parser(
        "windows",
        help="cut a timestamped CSV log into time windows, one folder a window",
        description="Writes OUTPUT/window-000/part-00000.csv, ... in time order (the input's "
        "header and columns, a window's rows in input order) and OUTPUT/windows.json (each "
        "window's period name, first and last timestamp, rows and --count churn), atomically.",
    )
    w.add_argument("--input", required=True, help="CSV log with a header row")
    w.add_argument(
        "--output",
        required=True,
        help="folder to write (an earlier windows output there is replaced)",
    )
    w.add_argument("--time", default="timestamp", help="timestamp column (default timestamp)")
    w.add_argument(
        "--by",
        required=True,
        help="day, week (from Monday, UTC), month, year, or rows:N (N rows a window in time order)",
    )
    w.add_argument(
        "--time-format",
        default="unix",
        help="unix (integer seconds, the default) or iso (ISO-8601 text; no offset: UTC)",
    )
    w.add_argument("--format", default="csv", help="part file format: csv (the default) or parquet")
    w.add_argument(
        "--count",
        action="append",
        default=[],
        metavar="COLUMN",
        help="a categorical column whose distinct values and values new to each window are "
        "counted in windows.json (repeatable)",
    )
    w.add_argument(
        "--min-rows",
        type=int,
        default=0,
        help="merge a window of fewer rows into the next one (the last into the one before; "
        "default 0: none)",
    )
    w.set_defaults(handler="pipelines.data_commands:cmd_windows")


def predict(sub: Subparsers) -> None:
    p = sub.add_parser(
        "predict",
        help="score logs with a SavedModel into Parquet scores (row_id, score) for `stitchrec ab`",
        description="Scores Parquet shards (read with the SavedModel's schema) or raw files "
        "(--schema) as tasks on an engine, the SavedModel loaded once per worker; writes "
        "OUTPUT/part-*.parquet with row_id and the model's score outputs, and _SUCCESS, "
        "atomically.",
    )
    p.add_argument("--model", required=True, help="a SavedModel exported by `stitchrec export`")
    p.add_argument(
        "--data", nargs="+", required=True, help="Parquet shards, or raw files with --schema"
    )
    p.add_argument("--output", required=True, help="folder for the scores (replaced if earlier)")
    p.add_argument("--schema", default=None, help="schema of raw --data files (e.g. criteo)")
    p.add_argument(
        "--row-id",
        default=None,
        help="a field whose value is the row id, unique on every row (default: the row's 0-based "
        "position in --data)",
    )
    p.add_argument("--batch-size", type=int, default=8192, help="rows per model call")
    _bad_rows(p)
    engine_flags(p)
    chunk_flag(p)
    p.set_defaults(handler="pipelines.predict:cmd_predict")


def data_service(sub: Subparsers) -> None:
    p = sub.add_parser(
        "data-service",
        help="tf.data service servers that run the TFRecord training input for `stitchrec "
        "train` ([data] data_service): `data-service dispatcher`, `data-service worker`",
        description="Runs a tf.data service dispatcher or worker until SIGTERM or SIGINT; "
        "prints its address once serving. A training config's [data] data_service names the "
        "dispatcher; its workers read, parse and shuffle the TFRecord input's windows and send "
        "batches to the training process (docs/distributed.md).",
    )
    roles = p.add_subparsers(dest="role", required=True)
    d = roles.add_parser("dispatcher", help="the dispatcher: hands the epoch's windows to workers")
    d.add_argument("--port", type=port, default=5050, help="port (0: any free port)")
    d.add_argument(
        "--work-dir",
        default=None,
        help="folder where it journals its state: restarted on it, it resumes its jobs",
    )
    d.set_defaults(handler="pipelines.data_service:cmd_dispatcher")
    w = roles.add_parser("worker", help="a worker: runs the input of the windows it is handed")
    w.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    w.add_argument("--port", type=port, default=0, help="port (0: any free port)")
    w.add_argument(
        "--host",
        default="localhost",
        help="the host name training processes reach this worker by (default: localhost)",
    )
    w.set_defaults(handler="pipelines.data_service:cmd_worker")
