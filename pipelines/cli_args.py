"""The flags of every ``stitchrec`` command, and which function runs it.

Each function here (and in ``pipelines.cli_args_data`` for the data commands ``generate``,
``convert``, ``stats`` and ``add-history``) adds one command's sub-parser and names its handler
as ``"module:function"`` (``set_defaults(handler=...)``); ``pipelines.cli`` imports that module
only when the command runs. This module imports argparse and the flags' value types
(``pipelines.cli_types``) only, so ``stitchrec --help`` and every command's ``--help`` start
without TensorFlow.
"""

from __future__ import annotations

import argparse

from pipelines.cli_types import (
    int_list,
    non_negative_int,
    positive,
    positive_float,
)

Subparsers = argparse._SubParsersAction

MODEL_TYPES = ("lr", "fm", "dnn", "dcn_v2")
FIVES_ARTIFACT = "crosses_fives.json"  # default file name of `crosses fives`' artifact
FIVES_DESCRIPTION = f"""\
Search which feature crosses matter (FIVES) and write them.

Reads the training split of a pipeline config's data (converting raw files into the run's
``data/`` folder once, exactly as ``stitchrec train`` does), runs the FIVES search
(``features.crosses.fives_search``) with one progress line per epoch and writes the cross artifact
(``features.crosses``; default ``<output_dir>/{FIVES_ARTIFACT}``). The training config then
names it::

    [data]
    crosses = "../runs/movielens/{FIVES_ARTIFACT}"
    cross_top_n = 5

``--set`` takes ``features.crosses.fives_config.FivesConfig`` keys (``--set sparsity=0.02``). After the
search, every triple (``screen_orders``) is also tested by the exhaustive interaction screen
(``features.crosses.interaction_screen``), which finds pure interactions the edge search cannot;
``--no-screen`` leaves it out.
"""


def add_set_option(p: argparse.ArgumentParser, help_text: str) -> None:
    """The repeatable ``--set KEY=VALUE`` option of ``p`` (``args.set``: a list of strings)."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help_text)


def _bad_rows(
    p: argparse.ArgumentParser,
    default: int | None = 0,
    text: str = "bad raw rows to skip and count; one more is an error (default: 0)",
) -> None:
    p.add_argument("--max-bad-rows", type=non_negative_int, default=default, help=text)


def engine_flags(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--cluster``, ``--workers``, ``--task-retries``: where the command's data
    jobs run (``pipelines.engines``; a config's ``[engine]`` section, overridden)."""
    g = p.add_argument_group(
        "engine", "where the data job's tasks run; the output is the same on every engine"
    )
    g.add_argument(
        "--engine",
        choices=("local", "dask"),
        default=None,
        help="local: this process (the default); dask: Dask distributed, on --cluster or a "
        "local cluster of --workers processes",
    )
    g.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="a Dask scheduler, e.g. tcp://HOST:8786 (implies --engine dask); the workers need "
        "the same files at the same paths",
    )
    g.add_argument(
        "--workers",
        type=non_negative_int,
        default=None,
        help="processes of the local Dask cluster (0 or none: one per CPU core)",
    )
    g.add_argument(
        "--task-retries",
        type=non_negative_int,
        default=None,
        help="times a task that failed is run again before the job fails (default 2)",
    )


def chunk_flag(p: argparse.ArgumentParser) -> None:
    """``--chunk-mb``: the bytes of raw text one task reads."""
    p.add_argument(
        "--chunk-mb",
        type=positive_float,
        default=None,
        help="MiB of an uncompressed raw text file one task reads (default 64; a compressed "
        "file is one task)",
    )


def _raw_input(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--schema", required=True, help="schema file or shipped schema name (e.g. criteo)"
    )
    p.add_argument("--input", nargs="+", required=True, help="raw files, folders or glob patterns")


def demo(sub: Subparsers) -> None:
    d = sub.add_parser(
        "demo", help="the whole pipeline on synthetic data: stats, train, export, evaluate"
    )
    d.add_argument(
        "--rows",
        type=positive,
        default=2_000_000,
        help="synthetic rows (default 2,000,000; at least 1,000)",
    )
    d.add_argument(
        "--output",
        default="runs/demo",
        help="folder for the data, the run, the SavedModel and demo_report.json: a new or "
        "empty folder, or an earlier demo's",
    )
    d.add_argument("--model", default="dcn_v2", choices=MODEL_TYPES, help="model type")
    d.add_argument("--epochs", type=positive, default=1, help="training epochs")
    d.set_defaults(handler="pipelines.demo:cmd_demo")


def train(sub: Subparsers) -> None:
    t = sub.add_parser("train", help="train (or resume) from a TOML config")
    t.add_argument("--config", required=True, help="pipeline config TOML (see configs/)")
    add_set_option(t, "override a config value, e.g. --set train.epochs=3")
    t.add_argument("--output", help="run folder (overrides output_dir)")
    t.add_argument(
        "--continue",
        dest="continue_from",
        metavar="RUN",
        help="continue the finished run RUN by value (train.continue_from; docs/continuous.md)",
    )
    _bad_rows(t, None, "bad raw rows to skip and count (data.max_bad_rows)")
    engine_flags(t)
    t.set_defaults(handler="pipelines.run_commands:cmd_train")


def tune(sub: Subparsers) -> None:
    t = sub.add_parser(
        "tune",
        help="search training hyper-parameters (Optuna): one train run per trial, on validation",
        description=(
            "Searches the config's [tune] space (or --space, or the default space; "
            "docs/tuning.md): every trial is a `stitchrec train` run in <tune dir>/trial-<n>, "
            "valued by its best validation metric and pruned when its validation curve is "
            "below the median. The same command again continues the study up to --trials."
        ),
    )
    t.add_argument("--config", required=True, help="pipeline config TOML, with a [tune] section")
    t.add_argument(
        "--trials",
        type=positive,
        required=True,
        help="trials of the study in total (a continued study runs the rest)",
    )
    t.add_argument(
        "--timeout", type=positive_float, help="seconds after which this call starts no new trial"
    )
    t.add_argument(
        "--output",
        help="tune folder (default: <output_dir>-tune): new, empty, or an earlier study's, "
        "which is continued",
    )
    t.add_argument(
        "--space", help="TOML file of the search space (used instead of the [tune] section)"
    )
    add_set_option(t, "override a value of the base config, e.g. --set train.epochs=3")
    t.set_defaults(handler="pipelines.tune:cmd_tune")


def export(sub: Subparsers) -> None:
    e = sub.add_parser(
        "export",
        help="SavedModel of a training run: its chosen ensemble ([train] ensemble = 'auto'), "
        "else its selected checkpoint (the best validation one, else the latest)",
    )
    e.add_argument("--run", required=True, help="training run folder (stitchrec train)")
    e.add_argument("--output", help="SavedModel folder (default: <run>/export/<next version>)")
    e.add_argument(
        "--cascade-rank",
        metavar="RUN",
        help="export one cascade SavedModel: --run is the pre-ranking run, RUN the ranking run",
    )
    e.add_argument(
        "--keep",
        type=positive,
        metavar="M",
        help="candidates the cascade's pre-ranking keeps (default 50; only with --cascade-rank)",
    )
    e.add_argument(
        "--fuse-kernels",
        action="store_true",
        help="export the embedding block as one generated C++ op (compiler_opt.embedding_op); the "
        "server loads or compiles it before the model",
    )
    e.add_argument(
        "--ensemble-runs",
        nargs="+",
        metavar="RUN",
        default=[],
        help="export one SavedModel averaging the selected checkpoints of --run and these runs "
        "(e.g. the same config trained with other seeds; the runs must take the same fields)",
    )
    e.add_argument(
        "--combine",
        choices=["logits", "probabilities"],
        default=None,
        help="how --ensemble-runs members are averaged (default: logits; only with "
        "--ensemble-runs)",
    )
    e.add_argument(
        "--single",
        action="store_true",
        help="of a run with a chosen ensemble: export its selected single checkpoint instead",
    )
    e.add_argument(
        "--quantize",
        choices=("int8", "fp16"),
        help="store the embedding tables row-wise quantized: int8 with a per-row scale and "
        "offset, or fp16 (each member's, for an ensemble; not with --fuse-kernels or "
        "--cascade-rank)",
    )
    e.add_argument(
        "--quantize-min-rows",
        type=int,
        default=1024,
        metavar="N",
        help="--quantize only the tables of at least N rows; smaller ones stay fp32 (default 1024)",
    )
    _fuse_flags(e)
    e.set_defaults(handler="pipelines.run_commands:cmd_export")


def _fuse_flags(e: argparse.ArgumentParser) -> None:
    e.add_argument(
        "--fuse",
        action="store_true",
        help="ask the server to fuse the serving signature (planned XLA clusters, padded to "
        "batch-size buckets, compiled at load): writes assets.extra/fusion.json",
    )
    e.add_argument(
        "--fuse-ladder",
        type=int_list,
        default=(8, 16, 32, 64, 128, 256, 512),
        metavar="N,N,...",
        help="batch-size buckets of --fuse (default 8,16,...,512)",
    )
    e.add_argument(
        "--fuse-plan-batch", type=int, default=256, help="batch size the fusion plan is made at"
    )
    e.add_argument(
        "--fuse-realization",
        choices=("xla_clusters", "generated"),
        default="xla_clusters",
        help="how --fuse runs the planned groups: XLA clusters (default), or the elementwise "
        "loop groups as generated C++ ops and the rest as TensorFlow ops (shape-generic: no "
        "padding, no compilation)",
    )
    e.add_argument(
        "--fuse-loop-matmuls",
        action="store_true",
        help="with --fuse-realization generated: also try each loop op taking the matmul that "
        "feeds it (fewer ops; kept if faster at the server's warm-up)",
    )


def evaluate(sub: Subparsers) -> None:
    v = sub.add_parser("evaluate", help="AUC and log loss of a SavedModel on held-out data")
    v.add_argument("--model", required=True, help="SavedModel folder (stitchrec export)")
    v.add_argument(
        "--data", nargs="+", required=True, help="Parquet shards, or raw files with --schema"
    )
    v.add_argument("--schema", help="schema of raw --data files (default: Parquet shards)")
    v.add_argument(
        "--task",
        action="append",
        metavar="NAME",
        help="a task of a multi-task model to evaluate (repeatable; default: every task)",
    )
    _bad_rows(v)
    v.set_defaults(handler="pipelines.evaluate:cmd_evaluate")


def crosses(sub: Subparsers) -> None:
    p = sub.add_parser(
        "crosses",
        help="cross features: `crosses fives` searches which crosses matter (FIVES), "
        "`crosses pcf-gnn` builds the pair graph and pre-trains PCF-GNN",
    )
    csub = p.add_subparsers(dest="generator", required=True)
    _crosses_fives(csub)
    _crosses_pcf_gnn(csub)


def _crosses_fives(csub: Subparsers) -> None:
    p = csub.add_parser(
        "fives",
        help="FIVES edge search over the feature graph: rank explicit crosses (KDD'21)",
        description=FIVES_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="a pipeline config TOML (its [data] is read)")
    p.add_argument(
        "--out", default=None, help=f"artifact path (default <output_dir>/{FIVES_ARTIFACT})"
    )
    add_set_option(p, "a FivesConfig setting, e.g. sparsity=0.02 (repeatable)")
    p.add_argument("--max-rows", type=int, default=0, help="search on the first N rows (0: all)")
    p.add_argument("--epochs", type=int, default=None, help="search epochs (FivesConfig.epochs)")
    p.add_argument(
        "--max-order",
        type=int,
        default=None,
        help="K: highest cross order (2 to the number of fields searched)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the search")
    p.add_argument(
        "--fields",
        default=None,
        help="comma-separated fields to search, two or more categorical, multi-categorical or "
        "numeric inputs (default all of them)",
    )
    p.add_argument(
        "--triple-search",
        action="store_true",
        help="start from features.crosses.fives_config.TRIPLE_SEARCH (linear readout, "
        "contribution strength): finds pure triples among a few fields (docs/fives.md); "
        "--set still overrides",
    )
    p.add_argument(
        "--no-screen",
        action="store_true",
        help="skip the exhaustive interaction screen (screen_orders = [])",
    )
    engine_flags(p)
    p.set_defaults(handler="pipelines.crosses_fives:cmd_fives")


def _crosses_pcf_gnn(csub: Subparsers) -> None:
    p = csub.add_parser(
        "pcf-gnn",
        help="build the pair graph and pre-train PCF-GNN (config section [pair_stats])",
    )
    p.add_argument("--config", required=True, help="training config with a [pair_stats] section")
    add_set_option(p, "override a config value, e.g. --set pair_stats.steps=100")
    engine_flags(p)
    p.set_defaults(handler="pipelines.crosses_pcf:cmd_pcf_gnn")


def fuse(sub: Subparsers) -> None:
    p = sub.add_parser(
        "fuse",
        help="fusion of memory-bound ops (compiler_opt): `fuse explain` prints the fusion plan "
        "of a SavedModel signature, `fuse tune` searches its generated op's schedules",
    )
    fsub = p.add_subparsers(dest="fuse_command", required=True)
    e = fsub.add_parser("explain", help="print the fusion plan of a SavedModel signature")
    e.add_argument("saved_model", help="SavedModel folder (e.g. <run>/export/1)")
    e.add_argument("--batch", type=int, default=256, help="examples per call (unknown dim 0)")
    e.add_argument("--signature", default="serving_default", help="signature to plan")
    e.add_argument("--unknown-dim", type=int, default=1, help="value of later unknown dimensions")
    e.add_argument("--max-args", type=int, default=64, help="kernel arguments per group")
    e.add_argument("--max-groups", type=int, default=30, help="groups to list")
    e.add_argument("--json", default=None, help="also write the full plan to this file")
    e.add_argument("--recalibrate", action="store_true", help="measure the device again")
    e.add_argument(
        "--floor",
        action="store_true",
        help="also the floor: FLOPs and bytes per unit, the measured FMA peak and bandwidth, "
        "the least time they allow, and each unit's measured time at --batch (runs the model)",
    )
    e.add_argument(
        "--floor-calls", type=int, default=5, help="calls timed and profiled for --floor"
    )
    e.add_argument(
        "--data",
        default=None,
        help="Parquet shards of the model's schema (stitchrec convert): --floor runs the "
        "model on their first --batch rows instead of dummy inputs",
    )
    e.set_defaults(handler="pipelines.fuse:cmd_explain")
    t = fsub.add_parser(
        "tune",
        help="search the schedules of a --fuse-kernels export's embedding op on this machine "
        "and record the fastest (stitchrec export --fuse-kernels uses the records)",
    )
    t.add_argument("saved_model", help="SavedModel folder exported with --fuse-kernels")
    t.add_argument(
        "--batch", type=int, action="append", default=None, help="batch to tune (repeatable; 4096)"
    )
    t.add_argument("--trials", type=int, default=32, help="schedules measured per op and batch")
    t.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per op and batch")
    t.add_argument("--data", default=None, help="Parquet shards of the model's schema: real ids")
    t.add_argument("--seed", type=int, default=0, help="seed of the random schedules")
    t.add_argument("--json", default=None, help="also write every trial to this file")
    t.set_defaults(handler="pipelines.fuse:cmd_tune")


#: the fewest paired-bootstrap resamples `stitchrec ab --bootstrap` takes (besides 0: none)
AB_MIN_BOOTSTRAP = 100


def ab(sub: Subparsers) -> None:
    a = sub.add_parser(
        "ab",
        help="offline A/B comparison of two models on logged data (CIs, slices, off-policy)",
        description="Compare a candidate (treatment) with the production model (control) on the "
        "same logs: AUC, GAUC, logloss, calibration, NDCG@k, recall@k with paired-bootstrap "
        "intervals, per-slice metrics, and off-policy estimates when the logs have propensities.",
    )
    _ab_sources(a)
    _ab_metrics(a)
    _ab_off_policy(a)
    _bad_rows(a)
    a.add_argument("--grpc-timeout", type=float, default=60.0, help="seconds per gRPC call")
    a.add_argument(
        "--no-html",
        action="store_true",
        help="write ab.json only (an earlier ab.html in --output is removed)",
    )
    a.add_argument(
        "--threads", type=positive, default=1, help="threads for the bootstrap (same results)"
    )
    a.set_defaults(handler="pipelines.ab:cmd_ab")


def _ab_sources(a: argparse.ArgumentParser) -> None:
    a.add_argument(
        "--control",
        required=True,
        help="SavedModel dir, grpc://H:P/MODEL, .parquet scores, 'uniform', or logged:ARM / "
        "logged:vN (a prediction log's scores of the rows that arm or version served)",
    )
    a.add_argument("--treatment", required=True, help="same forms as --control")
    a.add_argument(
        "--data",
        nargs="+",
        required=True,
        help="logs: raw files (with --schema), Parquet shards, or a prediction log folder "
        "(`stitchrec serve --log-dir`, with --join)",
    )
    a.add_argument(
        "--data-format",
        choices=["auto", "files", "logs"],
        default="auto",
        help="logs: --data is a prediction log; auto (default): detected by its columns",
    )
    a.add_argument(
        "--join",
        metavar="OUTCOMES",
        help="a prediction log's outcomes: .parquet or .csv with the --on key, optionally row, "
        "and the label column(s); logged rows without an outcome are dropped and counted",
    )
    a.add_argument("--on", default="request_id", help="join key of --join (default request_id)")
    a.add_argument("--model", help="the model whose rows to read from a prediction log")
    a.add_argument(
        "--include-shadow",
        action="store_true",
        help="keep a prediction log's shadow rows (scored by a shadow version, never returned)",
    )
    a.add_argument(
        "--schema",
        help="schema of the logs (file or shipped name); default: schema.toml beside Parquet shards",
    )
    a.add_argument(
        "--output",
        help="folder for ab.json and ab.html: a new or empty folder, or an earlier ab output "
        "(its files are replaced)",
    )
    a.add_argument("--row-id", help="logs field holding row ids (default: 0-based row position)")
    a.add_argument("--id-column", default="row_id", help="row-id column of .parquet scores files")
    a.add_argument("--score-column", default="score", help="score column of .parquet scores files")


def _ab_metrics(a: argparse.ArgumentParser) -> None:
    a.add_argument("--group", help="user or request field: enables GAUC, NDCG@k, recall@k")
    a.add_argument(
        "--k", nargs="+", type=positive, default=[5, 10], help="cut-offs for NDCG@k and recall@k"
    )
    a.add_argument(
        "--slice",
        action="append",
        default=[],
        metavar="FIELD",
        help="report metrics per value of FIELD (repeatable)",
    )
    a.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help=f"paired bootstrap resamples: 0 (none: no intervals or verdicts) or at least "
        f"{AB_MIN_BOOTSTRAP} (default 1000)",
    )
    a.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    a.add_argument(
        "--resample",
        choices=["rows", "groups"],
        default="rows",
        help="bootstrap unit (groups: the --group field's values; needs --group)",
    )
    a.add_argument("--bins", type=positive, default=10, help="calibration bins")
    a.add_argument(
        "--min-slice-rows", type=int, default=100, help="slices with fewer rows are flagged"
    )
    a.add_argument(
        "--max-slice-values",
        type=positive,
        default=20,
        help="more values are pooled into '(other)'",
    )
    a.add_argument(
        "--primary",
        default="auc",
        help="metric the verdict is based on: auc (default), logloss, ece, calibration_ratio, "
        "mean_score, or with --group gauc, ndcg@K, recall@K (K of --k)",
    )
    a.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="NAME",
        help="a task of multi-task models to compare (repeatable; default: every task)",
    )


def _ab_off_policy(a: argparse.ArgumentParser) -> None:
    a.add_argument("--action", help="logged action field for off-policy estimates (e.g. item_id)")
    a.add_argument(
        "--propensity",
        help="logging-propensity field; enables off-policy estimates (needs --action)",
    )
    a.add_argument(
        "--policy-temperature",
        type=float,
        default=1.0,
        help="softmax temperature of a model's policy, >= 0 (0: greedy; default 1)",
    )
    a.add_argument(
        "--reward-folds",
        type=int,
        default=2,
        help="cross-fitting folds of DR's reward model: 0 (no DM or DR) or >= 2 (default 2)",
    )
    a.add_argument(
        "--policy",
        action="append",
        default=["uniform"],
        help="extra reference policies (default: uniform)",
    )
