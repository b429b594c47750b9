"""The ``stitchrec`` command line. Flags are read here (``pipelines.cli_args``) and nowhere else.

    stitchrec demo      [--rows N] [--output DIR] [--model TYPE] [--epochs N]
    stitchrec generate  --output DIR [--rows N] [--seed S] [--test-fraction X] [--criteo-tsv]
                        [--sequences] [--conversion]
    stitchrec generate  --output DIR --days N [--rows N] [--item-churn F] [--user-churn F] ...
    stitchrec convert   --schema S --input F... --output DIR [--test-fraction X] [--max-bad-rows N]
                        [--engine local|dask] [--cluster ADDRESS] [--workers N] [--task-retries N]
    stitchrec stats     --schema S --input F... --output DIR [--max-bad-rows N] [--engine ...]
    stitchrec add-history --input F --output F [--user C] [--item C] [--time C] [--length N] ...
    stitchrec windows   --input F --output DIR --by day|week|month|year|rows:N [--count C]... ...
    stitchrec train     --config FILE [--set KEY=VALUE]... [--output DIR] [--max-bad-rows N]
    stitchrec refit     --run DIR [--output DIR] [--epochs N] [--seed S] [--learning-rate LR]
    stitchrec tune      --config FILE --trials N [--timeout S] [--output DIR] [--space FILE] ...
    stitchrec export    --run DIR [--output DIR] [--cascade-rank RUN --keep M] [--fuse ...]
    stitchrec evaluate  --model DIR --data F... [--schema S] [--max-bad-rows N]
    stitchrec predict   --model DIR --data F... --output DIR [--schema S] [--row-id F] [--engine ...]
    stitchrec crosses fives    --config FILE [--set KEY=VALUE]... [--out PATH] ...
    stitchrec crosses pcf-gnn  --config FILE [--set KEY=VALUE]...
    stitchrec serve     --repo DIR [--host H] [--port P] [--workers N] ...
    stitchrec ab        --control A --treatment B --data LOGS... [--output DIR] ...
    stitchrec skew      --run RUN --data LOGS... [--model M] [--reference LOGS...] [--output DIR]
    stitchrec daily     --config FILE --window DATA --repo MODELS/NAME [--runs DIR] [--rule R]
    stitchrec data-service dispatcher [--port P] [--work-dir DIR]
    stitchrec data-service worker --dispatcher HOST:PORT [--port P] [--host H]
    stitchrec fuse explain SAVED_MODEL [--batch N] [--signature NAME] [--json FILE] ...

Each command's flags come from its function in ``pipelines.cli_args`` or, for the data
commands, ``pipelines.cli_args_data``, for ``daily``, ``pipelines.cli_args_daily``, for ``serve``,
``pipelines.cli_args_serve``, for ``skew``, ``pipelines.cli_args_skew`` (argparse
only); the module that runs it (TensorFlow and all) is imported only when the command runs, so
``stitchrec --help`` starts in a fraction of a second.

User errors (a bad flag, schema, config, data file or score source) print one ``error:`` line
naming what, where and what was expected, and exit with status 2; a lost peer of a distributed
run, a tf.data service that sent no batch in time
(``features.tfrecord.service.InputStalledError``) or a data job's task that failed for good on
its engine (``features.tasks.JobError``), prints one ``error:`` line and exits with status 3. A write that fails for a full disk or quota, or a file past the size
limit, prints one ``error:`` line naming the file (when the error names it) and exits 2. Anything
else is a bug and propagates with its traceback (status 1).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from features.crosses.artifact import CrossArtifactError
from features.crosses.fives_config import FivesDataError
from features.read_report import DataError
from features.schema import SchemaError
from features.tasks import JobError
from pipelines import cli_args, cli_args_daily, cli_args_data, cli_args_serve, cli_args_skew
from pipelines.config import ConfigError
from pipelines.errors import UsageError
from pipelines.loading import loading_modules, pause_collector_when_loading
from pipelines.stderr_filter import filtered_stderr

DESCRIPTION = "StitchRec: data, training, export, serving and evaluation of ranking models."
EPILOG = (
    "`crosses`, `data-service` and `fuse` take a sub-command (crosses fives, crosses pcf-gnn, "
    "data-service dispatcher|worker, fuse explain); "
    "`stitchrec COMMAND --help` lists a command's flags."
)

# The order `stitchrec --help` lists the commands in.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    cli_args.demo,
    cli_args_data.generate,
    cli_args_data.convert,
    cli_args_data.stats,
    cli_args_data.add_history,
    cli_args_data.windows,
    cli_args.train,
    cli_args_daily.refit,
    cli_args.tune,
    cli_args.export,
    cli_args.evaluate,
    cli_args_data.predict,
    cli_args.crosses,
    cli_args_serve.serve,
    cli_args.ab,
    cli_args_skew.skew,
    cli_args_daily.daily,
    cli_args_data.data_service,
    cli_args.fuse,
)

# Errors in what the user gave (flags, files, configs, data): one `error:` line, status 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    ConfigError,
    SchemaError,
    DataError,
    FivesDataError,
    CrossArtifactError,
    FileNotFoundError,
)

# User errors and the lost-peer error of modules that load TensorFlow, as (module, class): they
# are looked up in `sys.modules`, not imported. An exception of such a class exists only once its
# module has run, and `--help`, `convert` or `stats` never load TensorFlow to recognise them.
LOADED_USER_ERRORS = (
    ("compiler_opt.fused_signature", "FusionSpecError"),
    ("pipelines.evaluation.sources", "SourceError"),
    ("pipelines.evaluation.tasks", "TaskError"),
    ("pipelines.export", "EnsembleError"),
    ("ranking.metrics", "MetricInputError"),
)
LOST_PEER = ("pipelines.distribute", "PeerLostError")
INPUT_STALLED = ("features.tfrecord.service", "InputStalledError")

# A full disk or quota, or a file past the size limit: the errnos of OSError, and the texts
# TensorFlow's errors (tf.errors.OpError: ResourceExhausted, Unknown, Internal) carry for them.
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
FULL_DISK_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")
TF_OP_ERROR = ("tensorflow.python.framework.errors_impl", "OpError")


def _loaded(*names: tuple[str, str]) -> tuple[type[Exception], ...]:
    """The exception classes ``(module, class)`` of the modules this process has imported."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, Exception))


def full_disk_message(error: BaseException, output: str | None = None) -> str | None:
    """One line for a write that failed for lack of space (``FULL_DISK_ERRNOS``, or
    ``FULL_DISK_TEXTS`` in an OSError without errno, as pyarrow raises, or in a TensorFlow
    error), naming the file when the error does, else the command's ``output`` folder when
    given; None for any other error. The errors it was raised from count too."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        text = " ".join(str(error).split())
        if isinstance(error, OSError) and (
            error.errno in FULL_DISK_ERRNOS
            or (error.errno is None and any(t in text for t in FULL_DISK_TEXTS))
        ):
            where = error.filename or (f"under {output}" if output else "a file")
            return f"writing {where}: {error.strerror or text}; {_FULL_DISK_ADVICE}"
        if isinstance(error, _loaded(TF_OP_ERROR)) and any(t in text for t in FULL_DISK_TEXTS):
            # "{{function_node ...}} PATH; File too large [Op:SaveV2]"
            text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^]]*\]", "", text).strip()
            path, _, reason = text.rpartition("; ")
            where = path or (f"under {output}" if output else "a file")
            return f"writing {where}: {reason}; {_FULL_DISK_ADVICE}"
        error = error.__cause__ or error.__context__
    return None


_FULL_DISK_ADVICE = (
    "free disk space (or raise the quota or file size limit) or write to another folder, then "
    "run the command again (`stitchrec train` resumes from its last checkpoint)"
)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose error (a flag missing, unknown or out of range) is one
    ``error:`` line naming the command, with exit status 2, like every other user error
    (argparse prints its usage block, then ``PROG: error: ...``). Subcommands' parsers are of
    this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="stitchrec",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return p


def handler(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that runs the parsed command (``args.handler``: ``"module:function"``)."""
    module, _, name = args.handler.partition(":")
    # The command's module (and TensorFlow, pandas, ... with it) loads only when the command
    # runs: the parser imports none of them, which keeps `stitchrec --help` fast.
    with loading_modules():
        return getattr(importlib.import_module(module), name)


def exit_status(error: Exception) -> int | None:
    """2 for a user error, 3 for a lost peer of a distributed run, a tf.data service that sent
    no batch in time or a data job whose task failed for good on its engine, None for anything
    else."""
    if isinstance(error, (*_loaded(LOST_PEER, INPUT_STALLED), JobError)):  # may run it again
        return 3
    if isinstance(error, USER_ERRORS + _loaded(*LOADED_USER_ERRORS)):
        return 2
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run = handler(args)
    try:
        return run(args)
    except Exception as e:
        full_disk = full_disk_message(e, getattr(args, "output", None))
        if full_disk is not None:
            print(f"error: {full_disk}", file=sys.stderr, flush=True)
            return 2
        status = exit_status(e)
        if status is None:
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        return status


def entry() -> int:
    """The ``stitchrec`` console script: ``main`` with TensorFlow's start-up noise dropped from
    standard error (``pipelines.stderr_filter``)."""
    pause_collector_when_loading()  # this process is the command's own (``pipelines.loading``)
    with filtered_stderr():
        try:
            return main()
        except BrokenPipeError:  # the reader of standard output left (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE  # the status of a process a broken pipe stops


if __name__ == "__main__":
    sys.exit(entry())
