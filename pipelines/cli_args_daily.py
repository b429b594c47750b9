"""The flags of the commands that continue a finished run: ``stitchrec daily`` and ``stitchrec
refit`` (``pipelines.cli_args`` describes how a command's flags and handler are declared)."""

from __future__ import annotations

from pipelines.cli_args import Subparsers, add_set_option
from pipelines.cli_types import positive, seed

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
    d.add_argument(
        "--repo",
        required=True,
        help="model folder of the repository (MODELS/NAME): new, empty, or its numbered versions "
        "and traffic.toml only",
    )
    d.add_argument(
        "--runs",
        help="folder of the day runs (default: the config's output_dir): new, empty, or "
        "earlier day runs only",
    )
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


REFIT_DESCRIPTION = (
    "Continue a finished run over its own validation rows (docs/training.md): a new run in "
    "--output (default RUN-refit) that continues RUN by value for --epochs epochs over the rows "
    "RUN selected its checkpoint on, with RUN's model and training settings (a constant "
    "learning rate, no weight average, ensemble or early stopping), and scores its last "
    "checkpoint once on RUN's test rows. For logs whose test period comes later, validated on "
    'the most recent rows ([data] validation_split = "recent"). A run fitted by L-BFGS '
    '([train] optimizer = "lbfgs") is refit at its selected C on its training and validation '
    "rows together. Running the same command again resumes a killed refit: --output may be new, "
    "an empty folder, or RUN's earlier refit (its refit.json names RUN); any other existing "
    "path, RUN itself or a folder inside RUN is refused before anything is written."
)


def refit(sub: Subparsers) -> None:
    r = sub.add_parser(
        "refit",
        help="continue a finished run over its validation rows, then score it on its test rows",
        description=REFIT_DESCRIPTION,
    )
    r.add_argument("--run", required=True, help="the finished training run to continue")
    r.add_argument(
        "--output",
        help="the refit's run folder (default: RUN-refit beside RUN): new, empty, or RUN's "
        "earlier refit, which is resumed",
    )
    r.add_argument(
        "--epochs", type=positive, default=1, help="epochs over the validation rows (default 1)"
    )
    r.add_argument("--seed", type=seed, help="the refit's seed (default: RUN's [train] seed)")
    r.add_argument(
        "--learning-rate",
        type=float,
        help="the refit's constant learning rate (default: RUN's [train] learning_rate)",
    )
    r.set_defaults(handler="pipelines.refit:cmd_refit")
