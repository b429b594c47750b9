"""``stitchrec refit``: a finished run continued over its own validation rows.

    stitchrec refit --run RUN [--output DIR] [--epochs N] [--seed S] [--learning-rate LR]

A run selects its epoch (and its early stop) on validation rows it never trains on. Where the
logs drift and the validation rows are the most recent ones (``[data] validation_split =
"recent"``, docs/training.md), those rows are the most informative the model could learn from.
``refit`` trains on them after the selection: a new run in DIR (default ``RUN-refit``) that
continues RUN by value (``[train] continue_from``, docs/continuous.md: vocabularies merged by
value, so ids first seen in the validation rows get rows of their own) for ``--epochs`` epochs
(default 1) over RUN's validation rows, with no validation split of its own, and scores its
last checkpoint once on RUN's test rows. The schema RUN read its shards with is written beside
the refit's config as ``refit_schema.toml``, and ``refit.json`` (``{"run": RUN's absolute
path}``) marks the folder as RUN's refit. A killed refit resumes when the same command is run
again: DIR may be new, an empty folder, or a folder whose ``refit.json`` names RUN; anything else
(a file, a folder of other files, another run's refit, RUN itself or a folder inside it) is
refused before anything is written. The paths the refit's config names are absolute.

A run fitted exactly (``[train] optimizer = "lbfgs"``, docs/training.md) is refit the way
scikit-learn refits a chosen ``C``: a new L-BFGS run with RUN's selected ``C`` alone, over RUN's
training and validation rows together (the vocabularies computed on both), scored on RUN's test
rows; ``--epochs`` and ``--learning-rate`` do not apply to it.

Otherwise, RUN's [model] and [train] settings carry over, but for what needs validation rows or
a run's whole length: the refit trains at a constant learning rate (RUN's, or ``--learning-rate``), with
no weight average, no snapshot ensemble and no early stopping (it has no validation rows to
choose on), for ``--epochs``, with RUN's seed unless ``--seed``. RUN itself is not changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

from features.json_files import read_json_object
from features.read_report import DataError
from pipelines.config import DataConfig, PipelineConfig, TrainConfig, load_config
from pipelines.errors import UsageError, check_output_path
from pipelines.files import write_json_atomic
from pipelines.run.data import prepare_data
from pipelines.run.model import REPORT_WHAT, trained_optimizer
from pipelines.run.paths import RunPaths
from pipelines.run_commands import train_and_report

_print = functools.partial(print, flush=True)
#: the default output folder: RUN's path with this suffix
SUFFIX = "-refit"
#: the schema of RUN's shards, written into the refit's folder
SCHEMA_FILE = "refit_schema.toml"
#: the file that marks a folder as a refit's: ``{"run": RUN's absolute path}``
MARKER_FILE = "refit.json"


def refit_config(
    run: Path,
    output: Path | None = None,
    epochs: int = 1,
    seed: int | None = None,
    learning_rate: float | None = None,
) -> PipelineConfig:
    """The config of RUN's refit (module docstring): RUN's config with [data] its validation
    rows to train on and its test rows, and [train] continuing RUN for ``epochs`` at a constant
    ``learning_rate`` (default RUN's).

    Writes ``refit.json`` and ``refit_schema.toml`` into the output folder once every check
    has passed.

    Raises:
      UsageError: RUN is not a finished run, has no validation rows, ``epochs`` < 1,
        ``learning_rate`` <= 0, or ``output`` cannot be RUN's refit (``check_refit_output``).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise UsageError(f"--epochs must be an integer >= 1, got {epochs!r}")
    if learning_rate is not None and not learning_rate > 0:
        raise UsageError(f"--learning-rate must be > 0, got {learning_rate!r}")
    source = run.resolve()  # the paths written into the refit's config are absolute
    paths = RunPaths(source)
    if not paths.report.exists() or not paths.config.exists():
        raise UsageError(
            f"--run {str(run)!r}: not a finished training run (no train_report.json and "
            f"config.toml in it)"
        )
    out = (output if output is not None else source.with_name(source.name + SUFFIX)).resolve()
    check_refit_output(out, source, "--output" if output is not None else "the default output")
    cfg = load_config(paths.config)
    if cfg.preranking is not None or cfg.distribute is not None:
        section = "[preranking]" if cfg.preranking is not None else "[distribute]"
        raise UsageError(f"--run {str(run)!r}: a run with {section} cannot be refit")
    shards = prepare_data(cfg, paths, log=lambda _line: None)  # the run's own, not converted again
    if not shards.validation:
        raise UsageError(
            f"--run {str(run)!r}: the run has no validation rows to refit on ([data] "
            f"validation_fraction = 0 and no validation files)"
        )
    trained = trained_optimizer(cfg, paths)  # ``auto``: the one it chose
    exact = trained == "lbfgs"
    if exact and learning_rate is not None:
        raise UsageError(
            f"--run {str(run)!r} was fitted by L-BFGS (no learning rate): leave out --learning-rate"
        )
    selected_c = _selected_c(run, paths) if exact else None  # read before anything is written
    schema = out / SCHEMA_FILE  # the schema RUN read its shards with (columns named by field)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MARKER_FILE, {"run": str(source)})  # first: the folder is RUN's refit
    shards.schema.save(schema)
    rows = [*shards.train, *shards.validation] if exact else shards.validation
    data = DataConfig(
        schema=str(schema),
        train=tuple(str(f) for f in rows),
        test=tuple(str(f) for f in shards.test),
        validation_fraction=0.0,
        crosses=cfg.data.crosses,
        cross_top_n=cfg.data.cross_top_n,
        cross_hash_buckets=cfg.data.cross_hash_buckets,
        cap_hash_buckets=cfg.data.cap_hash_buckets,
        input_format=cfg.data.input_format,
        data_service=cfg.data.data_service,
        data_service_timeout=cfg.data.data_service_timeout,
    )
    seed = cfg.train.seed if seed is None else seed
    if exact:
        tc = dataclasses.replace(
            cfg.train,
            optimizer=trained,
            lbfgs_c=(selected_c,),
            early_stopping=None,
            seed=seed,
        )
    else:
        tc = _continued(
            dataclasses.replace(cfg.train, optimizer=trained), source, epochs, seed, learning_rate
        )
    return dataclasses.replace(cfg, output_dir=str(out), data=data, train=tc)


def check_refit_output(out: Path, run: Path, flag: str = "--output") -> None:
    """Raises UsageError when the absolute path ``out`` cannot be the refit of the absolute
    run folder ``run``: it is ``run`` or inside it, a file or under one, or an existing folder
    that is neither empty nor ``run``'s refit (its ``refit.json`` naming ``run``)."""
    if out == run or run in out.parents:
        raise UsageError(
            f"{flag} {str(out)!r} is the run being refit or a folder inside it ({str(run)!r}): "
            f"expected a folder outside it (default: {run.name}{SUFFIX} beside it)"
        )
    check_output_path(out, flag)
    if not out.is_dir() or not any(out.iterdir()):
        return
    marker = out / MARKER_FILE
    if not marker.is_file():
        raise UsageError(
            f"{flag} {str(out)!r} holds files that are not a `stitchrec refit` output (no "
            f"{MARKER_FILE}): expected a new or empty folder, or an earlier refit of "
            f"{str(run)!r} (which is resumed)"
        )
    try:
        named = read_json_object(marker, 'the {"run": ...} a refit writes').get("run")
    except DataError as e:
        raise UsageError(f"{flag} {str(out)!r}: {e}") from None
    if named != str(run):
        raise UsageError(
            f"{flag} {str(out)!r} is the refit of another run ({MARKER_FILE} names {named!r}): "
            f"expected a new or empty folder, or an earlier refit of {str(run)!r}"
        )


def _continued(
    tc: TrainConfig, run: Path, epochs: int, seed: int, learning_rate: float | None
) -> TrainConfig:
    """The ``[train]`` of a refit that continues ``run`` by value (module docstring)."""
    return dataclasses.replace(
        tc,
        continue_from=str(run),
        epochs=epochs,
        continue_epochs=0,
        max_steps=0,
        eval_every=0,
        early_stopping=None,
        lr_schedule="constant",
        lr_schedule_options={},
        learning_rate=tc.learning_rate if learning_rate is None else learning_rate,
        ensemble="none",
        ensemble_options={},
        weight_average="none",
        seed=seed,
    )


def _selected_c(run: Path, paths: RunPaths) -> float:
    """The ``C`` an L-BFGS run selected (its report's ``lbfgs.selected_c``; a run of one ``C``:
    that one)."""
    report = read_json_object(paths.report, REPORT_WHAT)
    block = report.get("lbfgs") or {}
    chosen = block.get("selected_c")
    if chosen is None and len(block.get("c_path", [])) == 1:
        chosen = block["c_path"][0]
    if chosen is None:
        raise UsageError(
            f"--run {str(run)!r}: its train_report.json names no selected C (lbfgs.selected_c)"
        )
    return float(chosen)


def cmd_refit(args: argparse.Namespace) -> int:
    run = Path(args.run)
    output = Path(args.output) if args.output else None
    cfg = refit_config(run, output, args.epochs, args.seed, args.learning_rate)
    if cfg.train.optimizer == "lbfgs":
        _print(
            f"refit: {run}'s C = {cfg.train.lbfgs_c[0]:g} fitted by L-BFGS on its "
            f"{len(cfg.data.train)} training and validation shard(s) into {cfg.output_dir}"
        )
    else:
        _print(
            f"refit: {run} continued over its {len(cfg.data.train)} validation shard(s) for "
            f"{cfg.train.epochs} epoch(s) into {cfg.output_dir}"
        )
    return train_and_report(cfg)
