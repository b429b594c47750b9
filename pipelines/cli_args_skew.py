"""The flags of ``stitchrec skew`` (``pipelines.cli_args`` describes how a command's flags and
handler are declared)."""

from __future__ import annotations

from pipelines.cli_args import Subparsers
from pipelines.cli_types import positive

SKEW_DESCRIPTION = (
    "Training/serving skew (docs/skew.md): per model input, the PSI and Jensen-Shannon "
    "divergence between the run's training statistics and the features of a prediction log "
    "folder (categorical value frequencies with an OOV bin, numeric quantile bins), the OOV "
    "rate's change, the mean shift, and the score's shift against reference logs. A field is "
    "flagged when its PSI is above --threshold-psi or its OOV rate grows by more than "
    "--threshold-oov. Writes skew.json and skew.html under --output."
)


def skew(sub: Subparsers) -> None:
    s = sub.add_parser(
        "skew",
        help="training/serving skew of a run against prediction logs (PSI, JS, OOV, score)",
        description=SKEW_DESCRIPTION,
    )
    s.add_argument("--run", required=True, help="a finished training run folder (stats/, schema)")
    s.add_argument("--data", nargs="+", required=True, help="prediction log folders or files")
    s.add_argument("--model", help="model of the logs to read (default: the only one logged)")
    s.add_argument(
        "--reference",
        nargs="+",
        help="prediction logs to compare the score with (e.g. the launch week's)",
    )
    s.add_argument(
        "--output",
        help="folder for skew.json and skew.html: a new or empty folder, or an earlier skew "
        "output (replaced)",
    )
    s.add_argument(
        "--threshold-psi", type=float, default=0.2, help="PSI above this flags (default: 0.2)"
    )
    s.add_argument(
        "--watch-psi",
        type=float,
        default=0.1,
        help="PSI above this is 'watch' (default: 0.1; at most --threshold-psi)",
    )
    s.add_argument(
        "--threshold-oov",
        type=float,
        default=0.05,
        help="OOV-rate growth above this flags (absolute, in (0, 1]; default: 0.05)",
    )
    s.add_argument(
        "--max-bins",
        type=positive,
        default=20,
        help="most frequent values with their own bin; the rest of the vocabulary is pooled",
    )
    s.add_argument(
        "--score-output",
        metavar="NAME",
        help="the logged output compared (default: score, left out when the logs have none; "
        "a NAME the logs lack is an error)",
    )
    s.add_argument("--include-shadow", action="store_true", help="also read shadow rows")
    s.add_argument("--json", action="store_true", help="print skew.json instead of the summary")
    s.set_defaults(handler="pipelines.skew:cmd_skew")
