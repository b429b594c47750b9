"""The flags of ``stitchrec daily`` (``pipelines.cli_args`` describes how a command's flags and
handler are declared)."""

from __future__ import annotations

from pipelines.cli_args import Subparsers, add_set_option

DAILY_DESCRIPTION = (
    "One day of continuous training (docs/continuous.md): trains the run "
    "<runs>/day-<window name> on the window, continuing the latest finished day run before it; "
    "scores it against the repository's served version on the run's test rows (paired "
    "bootstrap); exports it as the repository's next version when the rule accepts; writes "
    "<run>/daily_report.json. A rerun of the same call finishes a killed day and adds at most "
    "one version."
)


def daily(sub: Subparsers) -> None:
    d = sub.add_parser(
        "daily",
        help="one day of continuous training: train on a window, compare with the served "
        "version, export the next version when the rule accepts",
        description=DAILY_DESCRIPTION,
    )
    d.add_argument("--config", required=True, help="pipeline config TOML ([model], [train])")
    d.add_argument(
        "--window",
        required=True,
        help="the day's data: a folder with schema.toml, train/ and test/ Parquet shards, or a "
        "folder of raw files the config's schema reads (a window of `stitchrec windows`)",
    )
    d.add_argument("--repo", required=True, help="model folder of the repository (MODELS/NAME)")
    d.add_argument("--runs", help="folder of the day runs (default: the config's output_dir)")
    d.add_argument(
        "--rule",
        default="not_worse",
        help="not_worse (default: unless significantly worse), better (only when significantly "
        "better) or always",
    )
    d.add_argument("--metric", default="auc", help="auc (default) or logloss: what the rule reads")
    d.add_argument(
        "--bootstrap", type=int, default=1000, help="paired bootstrap resamples (default 1000)"
    )
    d.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    add_set_option(d, "override a config value, e.g. --set train.epochs=3")
    d.set_defaults(handler="pipelines.daily:cmd_daily")
