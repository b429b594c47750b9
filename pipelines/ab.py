"""``stitchrec ab``: offline A/B comparison of a candidate (treatment) with a production model
(control) on logged data. See docs/ab.md and ``pipelines.evaluation``.

    stitchrec ab --control A --treatment B --data LOGS... [--schema S] [--output DIR]
                 [--group FIELD] [--slice FIELD]... [--k 5 10] [--bootstrap 1000] [--seed 0]
                 [--action item_id --propensity propensity_score] ...

    stitchrec ab --control logged:stable --treatment CANDIDATE_DIR --data LOGDIR
                 --join outcomes.parquet --on request_id [--model M] [--include-shadow]

A and B: a SavedModel directory, grpc://HOST:PORT/MODEL, a .parquet scores file, ``uniform``, or
``logged:ARM`` / ``logged:vN`` (the scores a prediction log holds for the rows that traffic arm
or model version served; two different arms: an unpaired comparison of two populations).
The flags are defined in ``pipelines.cli_args``.
"""

from __future__ import annotations

import argparse

from pipelines.cli_args import AB_MIN_BOOTSTRAP
from pipelines.errors import UsageError
from pipelines.evaluation import report
from pipelines.evaluation.ab_run import ABOptions, run_ab


def check_bootstrap(resamples: int) -> None:
    """Raises UsageError unless ``--bootstrap`` is 0 (no bootstrap) or at least
    ``AB_MIN_BOOTSTRAP``: the ends of a 95% interval are the 2.5th and 97.5th percentiles of the
    resampled differences, and the p-value is at least 2 / (resamples + 1)."""
    if resamples < 0 or 0 < resamples < AB_MIN_BOOTSTRAP:
        raise UsageError(
            f"--bootstrap {resamples}: expected 0 (no bootstrap) or at least {AB_MIN_BOOTSTRAP} "
            f"resamples (the 95% interval's ends are the 2.5th and 97.5th percentiles of the "
            f"resampled differences)"
        )


def cmd_ab(args: argparse.Namespace) -> int:
    check_bootstrap(args.bootstrap)
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
        tasks=list(args.task),
        data_format=args.data_format,
        join=args.join,
        on=args.on,
        model=args.model,
        include_shadow=args.include_shadow,
    )
    result = run_ab(opts, log=lambda m: print(m, flush=True))
    print(report.console(result), flush=True)
    if args.output:
        print(
            f"wrote {args.output}/ab.json" + ("" if args.no_html else f" and {args.output}/ab.html")
        )
    return 0
