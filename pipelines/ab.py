"""``stitchrec ab``: offline A/B comparison of a candidate (treatment) with a production model
(control) on logged data. See docs/ab.md and ``pipelines.evaluation``.

    stitchrec ab --control A --treatment B --data LOGS... [--schema S] [--output DIR]
                 [--group FIELD] [--slice FIELD]... [--k 5 10] [--bootstrap 1000] [--seed 0]
                 [--action item_id --propensity propensity_score] ...

A and B: a SavedModel directory, grpc://HOST:PORT/MODEL, a .parquet scores file or ``uniform``.
"""

from __future__ import annotations

import argparse


def cmd_ab(args: argparse.Namespace) -> int:
    # the evaluation library (pandas, scipy, scikit-learn) loads only when `stitchrec ab` runs,
    # not at every CLI start-up (the CLI registers this module's parser)
    from pipelines.evaluation import report
    from pipelines.evaluation.compare import ABOptions, run_ab

    opts = ABOptions(
        control=args.control,
        treatment=args.treatment,
        data=list(args.data),
        schema=args.schema,
        output=args.output,
        row_id=args.row_id,
        id_column=args.id_column,
        score_column=args.score_column,
        group=args.group,
        k=list(args.k),
        slices=list(args.slice),
        resamples=args.bootstrap,
        seed=args.seed,
        unit=args.resample,
        bins=args.bins,
        min_slice_rows=args.min_slice_rows,
        max_slice_values=args.max_slice_values,
        primary=args.primary,
        action=args.action,
        propensity=args.propensity,
        temperature=args.policy_temperature,
        reward_folds=args.reward_folds,
        policies=list(args.policy),
        max_bad_rows=args.max_bad_rows,
        grpc_timeout_s=args.grpc_timeout,
        html=not args.no_html,
        workers=args.threads,
    )
    result = run_ab(opts, log=lambda m: print(m, flush=True))
    print(report.console(result), flush=True)
    if args.output:
        print(
            f"wrote {args.output}/ab.json" + ("" if args.no_html else f" and {args.output}/ab.html")
        )
    return 0


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser(
        "ab",
        help="offline A/B comparison of two models on logged data (CIs, slices, off-policy)",
        description="Compare a candidate (treatment) with the production model (control) on the "
        "same logs: AUC, GAUC, logloss, calibration, NDCG@k, recall@k with paired-bootstrap "
        "intervals, per-slice metrics, and off-policy estimates when the logs have propensities.",
    )
    a.add_argument(
        "--control",
        required=True,
        help="SavedModel dir, grpc://H:P/MODEL, .parquet scores or 'uniform'",
    )
    a.add_argument("--treatment", required=True, help="same forms as --control")
    a.add_argument(
        "--data", nargs="+", required=True, help="logs: raw files (with --schema) or Parquet shards"
    )
    a.add_argument(
        "--schema",
        help="schema of the logs (file or shipped name); default: schema.toml beside Parquet shards",
    )
    a.add_argument("--output", help="folder for ab.json and ab.html")
    a.add_argument("--row-id", help="logs field holding row ids (default: 0-based row position)")
    a.add_argument("--id-column", default="row_id", help="row-id column of .parquet scores files")
    a.add_argument("--score-column", default="score", help="score column of .parquet scores files")
    a.add_argument("--group", help="user or request field: enables GAUC, NDCG@k, recall@k")
    a.add_argument(
        "--k", nargs="+", type=_positive, default=[5, 10], help="cut-offs for NDCG@k and recall@k"
    )
    a.add_argument(
        "--slice",
        action="append",
        default=[],
        metavar="FIELD",
        help="report metrics per value of FIELD (repeatable)",
    )
    a.add_argument(
        "--bootstrap", type=int, default=1000, help="paired bootstrap resamples (0: none)"
    )
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--resample", choices=["rows", "groups"], default="rows", help="bootstrap unit")
    a.add_argument("--bins", type=_positive, default=10, help="calibration bins")
    a.add_argument(
        "--min-slice-rows", type=int, default=100, help="slices with fewer rows are flagged"
    )
    a.add_argument(
        "--max-slice-values",
        type=_positive,
        default=20,
        help="more values are pooled into '(other)'",
    )
    a.add_argument("--primary", default="auc", help="metric the verdict is based on")
    a.add_argument("--action", help="logged action field for off-policy estimates (e.g. item_id)")
    a.add_argument("--propensity", help="logging-propensity field; enables off-policy estimates")
    a.add_argument(
        "--policy-temperature",
        type=float,
        default=1.0,
        help="softmax temperature of a model's policy (0: greedy)",
    )
    a.add_argument(
        "--reward-folds", type=int, default=2, help="cross-fitting folds of DR's reward model"
    )
    a.add_argument(
        "--policy",
        action="append",
        default=["uniform"],
        help="extra reference policies (default: uniform)",
    )
    a.add_argument("--max-bad-rows", type=int, default=0)
    a.add_argument("--grpc-timeout", type=float, default=60.0, help="seconds per gRPC call")
    a.add_argument("--no-html", action="store_true", help="write ab.json only")
    a.add_argument(
        "--threads", type=_positive, default=1, help="threads for the bootstrap (same results)"
    )
    a.set_defaults(func=cmd_ab)
