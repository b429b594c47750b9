"""``stitchrec fuse explain SAVED_MODEL``: the fusion plan of a SavedModel's signature.

    stitchrec fuse explain SAVED_MODEL [--batch N] [--signature NAME] [--unknown-dim D]
                           [--max-args A] [--max-groups G] [--json FILE] [--recalibrate]
                           [--floor [--floor-calls C]]

Reads the signature's graph (nested calls inlined, see ``compiler_opt.ir``), loads or measures
the cost coefficients of this machine's device (``compiler_opt.cost``; cached under
``~/.cache/stitchrec/compiler_opt/``, ``$STITCHREC_CACHE`` to move it) and prints the planned
groups (kind, ops, launches, bytes before and after, estimated time saved), the totals, and
which elementwise loop groups have a generated C++ form (``--fuse-realization generated``).
With ``--floor``, also the floor of the signature (``compiler_opt.floor``): per unit and in
total the FLOPs and bytes, this CPU's measured FMA peak (cached beside the coefficients), the
least time they allow, and each unit's measured time at ``--batch`` (on dummy inputs, or the
first rows of ``--data``); an export with ``fusion.json`` is also timed as the server realizes
it.
The flags are defined in ``pipelines.cli_args``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import saved_model_pb2

from compiler_opt import cost, floor, ir, planner, realize, registry, toolchain, tune
from compiler_opt.embedding_op import assets as emb_assets
from compiler_opt.embedding_op import cuda as emb_cuda
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.fused_signature import FusedSignature, read_spec
from compiler_opt.row_op import spec as row_def
from features.schema import load_schema
from features.shard_reader import column_to_numpy, iter_record_batches, list_parquet
from pipelines.errors import UsageError, check_output_path


def _generated_forms(args: argparse.Namespace, coefficients: Any) -> str:
    """As the server runs ``--fuse-realization generated``: the signature frozen and planned,
    which of its ``loop`` groups have a generated C++ form (``compiler_opt.loop_op``) and
    why the others do not, and the matmul epilogues left to the matmul."""
    emb_assets.load_for_saved_model(args.saved_model)  # an export with the embedding op
    loaded = tf.saved_model.load(args.saved_model)
    frozen, tabulation = realize.tabulated(realize.freeze(loaded.signatures[args.signature]))
    lp = realize.plan_loops(
        frozen,
        coefficients,
        args.batch,
        unknown_dim=args.unknown_dim,
        max_args=args.max_args,
    )
    graph, plan = lp.graph, lp.plan
    generated = {n for g in lp.loops for n in g.nodes}
    rows = sum(isinstance(g.spec, row_def.RowSpec) for g in lp.loops)
    loops = [
        g
        for g in plan.groups
        if (g.kind in ("loop", "input", "stitch") and len(g.nodes) >= 2)
        or "part(s) generated" in lp.left.get(g.id, "")
    ]
    why = {
        g.id: "" if g.nodes[0] in generated else lp.left.get(g.id, "not generated") for g in loops
    }
    ok = [str(i) for i, reason in why.items() if not reason]
    lines = [
        f"served with --fuse-realization generated (the signature frozen, planned again): "
        f"{len(ok)} of {len(loops)} group(s) as generated ops ({rows} row "
        f"programs with reductions, {lp.matmuls} loop ops taking the matmul that feeds them); "
        f"matmul epilogues left to the matmul: {len(plan.epilogues)}"
    ]
    for g in loops:
        ops = ", ".join(graph[n].op for n in g.nodes[:6])
        lines.append(f"  {g.kind} {ops}: {why[g.id] or 'generated'}")
    lines += _cuda_forms(frozen.graph_def, len(lp.loops))
    if tabulation.tables or tabulation.left:
        lines.append(
            f"per-id masks of the embedding op tabulated over their id domain: "
            f"{len(tabulation.tables)} ({tabulation.bytes} bytes of constants), "
            f"ops in row form: {len(tabulation.row_form)}"
        )
        lines += [f"  left {name}: {reason}" for name, reason in tabulation.left.items()]
    return "\n".join(lines)


def _cuda_forms(graph_def: Any, generated: int) -> list[str]:
    """Lines: which generated ops of the served graph (``graph_def``, tabulated) would run on a
    GPU (the CUDA forms of ``compiler_opt``): every loop op and row program (a loop op's matmul
    stays apart there), and each embedding op whose spec has a CUDA form."""
    embedding = sorted({n.op for n in graph_def.node if n.op.startswith("StitchrecFusedEmb")})
    why = {op: emb_cuda.embedding_unsupported(emb_ops.kernel_named(op).spec) for op in embedding}
    lines = [
        f"on a GPU with nvcc (CUDA forms): {generated} of {generated} generated loop/row ops, "
        f"{sum(not w for w in why.values())} of {len(why)} embedding ops"
    ]
    lines += [
        f"  {op}: no CUDA form: {w} (the version serves on the CPU)" for op, w in why.items() if w
    ]
    return lines


def _check_saved_model(saved_model: str) -> None:
    """``UsageError`` when ``saved_model`` is not a SavedModel folder (one with a
    ``saved_model.pb``), before TensorFlow reads it."""
    p = Path(saved_model)
    if not p.is_dir():
        what = "it does not exist" if not p.exists() else "it is a file"
        raise UsageError(
            f"SavedModel path {saved_model!r} is not a folder ({what}): expected the folder "
            "`stitchrec export` writes (e.g. <run>/export/1)"
        )
    if not (p / "saved_model.pb").is_file() and not (p / "saved_model.pbtxt").is_file():
        raise UsageError(
            f"{saved_model!r} is not a SavedModel: it has no saved_model.pb (expected the "
            "folder `stitchrec export` or tf.saved_model.save wrote, e.g. <run>/export/1)"
        )


def _check_signature(saved_model: str, signature: str) -> None:
    """``UsageError`` when ``saved_model`` is not a SavedModel folder, or ``--signature`` is
    not a signature of it (read from its ``saved_model.pb``)."""
    _check_saved_model(saved_model)
    pb = Path(saved_model) / "saved_model.pb"
    if not pb.is_file():
        return
    try:
        meta_graphs = saved_model_pb2.SavedModel.FromString(pb.read_bytes()).meta_graphs
    except DecodeError as e:
        raise UsageError(
            f"{saved_model!r} is not a complete SavedModel: its saved_model.pb does not parse "
            f"({e}); expected the folder `stitchrec export` writes"
        ) from None
    names = sorted({n for mg in meta_graphs for n in mg.signature_def if not n.startswith("__")})
    if signature not in names:
        raise UsageError(
            f"--signature: signature {signature!r} is not in SavedModel {saved_model!r}; "
            f"it has {names}"
        )


def cmd_explain(args: argparse.Namespace) -> int:
    for flag in ("batch", "unknown_dim", "max_groups", "floor_calls"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.max_args < 2:
        raise UsageError(f"--max-args must be >= 2, got {args.max_args}")
    if args.data is not None and not args.floor:
        raise UsageError(
            f"--data {args.data!r}: only --floor reads --data (the plan needs no rows); add "
            "--floor or drop --data"
        )
    if args.json:
        check_output_path(args.json, "--json", folder=False)
    _check_signature(args.saved_model, args.signature)
    data = _data_files(args.saved_model, args.data)  # before the plan is printed
    emb_assets.load_for_saved_model(args.saved_model)  # an --fuse-kernels export's ops first
    graph = ir.from_saved_model(args.saved_model, args.signature)
    coefficients = cost.load_or_calibrate(recalibrate=args.recalibrate)
    plan = planner.plan(
        graph, coefficients, args.batch, unknown_dim=args.unknown_dim, max_args=args.max_args
    )
    print(f"{args.saved_model} [{args.signature}]", flush=True)
    print(plan.to_text(max_groups=args.max_groups), flush=True)
    print(_generated_forms(args, coefficients), flush=True)
    c = coefficients
    print(
        f"coefficients: launch {c.launch_s * 1e6:.3f} us, bandwidth {c.bandwidth / 1e9:.1f} GB/s, "
        f"gather {c.gather_row_s * 1e9:.1f} ns/row ({c.device}, {c.created})",
        flush=True,
    )
    report = plan.to_dict()
    if args.floor:
        measured = _floor(args, coefficients, data)
        print(measured.to_text(max_units=args.max_groups), flush=True)
        report["floor"] = measured.to_dict()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _floor(args: argparse.Namespace, coefficients: Any, data: Any) -> floor.Floor:
    """The served signature's floor, each unit measured at ``--batch``: on a CPU with its
    measured FMA peak, on a GPU with the calibrated matmul rate (the FMA loop is CPU code)."""
    if coefficients.device.startswith("gpu"):
        peak_flops, source = coefficients.matmul_flops, "the GPU's calibrated matmul rate"
    else:
        try:
            peak_flops = floor.load_or_measure_peak(remeasure=args.recalibrate).flops
        except toolchain.CompilerUnavailable as e:
            raise UsageError(
                f"--floor measures the FMA peak with a generated C++ loop: {e}"
            ) from None
        source = "FP32 FMA, measured"
    loaded = tf.saved_model.load(args.saved_model)
    fn = loaded.signatures[args.signature]
    inputs = _inputs(fn, args.batch, data)
    report = floor.of_signature(
        fn,
        coefficients,
        peak_flops,
        args.batch,
        unknown_dim=args.unknown_dim,
        max_args=args.max_args,
        calls=args.floor_calls,
        peak_source=source,
        inputs=inputs,
    )
    spec = read_spec(args.saved_model)
    if spec is None or spec.signature != args.signature:
        return report
    # as `stitchrec serve` runs it: realized, warmed up (candidates timed), then timed
    served = FusedSignature(fn, spec, coefficients)
    features = dict(zip(sorted(fn.structured_input_signature[1]), inputs, strict=True))
    served.warmup({k: v.numpy() for k, v in features.items()})
    served_s = floor.median_wall_s(lambda: served(features), args.floor_calls)
    what = served.realization + (f", {served.choice}" if served.choice else "")
    return dataclasses.replace(report, served_s=served_s, served=what)


def _data_files(saved_model: str, data: str | None) -> tuple[Any, list[Path], str] | None:
    """``--data``: the export's schema and the Parquet shards of ``data`` (None without
    ``--data``) and ``data``, checked before any work: ``UsageError`` for an export without a
    StitchRec schema, or a path without shards."""
    if data is None:
        return None
    schema_file = Path(saved_model) / "assets.extra" / "schema.toml"
    if not schema_file.is_file():
        raise UsageError(
            f"--data needs a StitchRec SavedModel; {saved_model!r} has no {schema_file}"
        )
    schema = load_schema(schema_file)
    try:
        files = list_parquet(data)
    except (OSError, ValueError) as e:
        raise UsageError(f"--data {data!r}: {e}") from None
    if not files:
        raise UsageError(f"--data {data!r}: no Parquet shards (*.parquet) found")
    return schema, files, data


def _inputs(fn: Any, batch: int, data: tuple[Any, list[Path], str] | None) -> list[tf.Tensor]:
    """The signature's flat inputs at ``batch`` rows: the first rows of the Parquet shards of
    ``data`` (``_data_files``; repeated when fewer), read with the export's schema; dummy ones
    without."""
    if data is None:
        return floor.dummy_inputs(fn, batch)
    schema, files, where = data
    names = sorted(fn.structured_input_signature[1])
    fields = [schema.field(n) for n in names]
    columns: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rows = 0
    for rb in iter_record_batches(schema, files, fields):
        for f in fields:
            columns[f.name].append(column_to_numpy(rb.column(f.name), f))
        rows += rb.num_rows
        if rows >= batch:
            break
    if rows == 0:
        raise UsageError(f"--data {where!r}: the shards hold no rows")
    index = np.arange(batch) % rows
    return [tf.constant(np.concatenate(columns[n])[index]) for n in names]


def cmd_tune(args: argparse.Namespace) -> int:
    """``stitchrec fuse tune``: the schedules of each embedding op of a ``--fuse-kernels``
    export searched at each ``--batch`` (``compiler_opt.tune.search``, each schedule's op timed
    alone on the export's own inputs to it; the best and the default measured 5 more times,
    alternating), the fastest recorded for this device."""
    if args.json:
        check_output_path(args.json, "--json", folder=False)
    batches = args.batch or [4096]
    for name, value in (("batch", min(batches)), ("trials", args.trials)):
        if value < (2 if name == "trials" else 1):
            raise UsageError(f"--{name} must be >= {2 if name == 'trials' else 1}, got {value}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout}")
    _check_signature(args.saved_model, "serving_default")
    data = _data_files(args.saved_model, args.data)
    emb_assets.load_for_saved_model(args.saved_model)
    loaded = tf.saved_model.load(args.saved_model)
    fn = loaded.signatures["serving_default"]
    results = []
    for batch in batches:
        ops = tune.export_ops(fn, _inputs(fn, batch, data))
        if not ops:
            raise UsageError(
                f"{args.saved_model!r} has no generated embedding op: export it with --fuse-kernels"
            )
        for bench in ops:
            result = tune.search(
                bench.spec,
                bench.measure,
                batch,
                trials=args.trials,
                timeout_s=args.timeout,
                seed=args.seed,
                progress=_progress,
                prepare=lambda specs: registry.precompile([(s, emb_ops.EMBEDDING) for s in specs]),
                confirm=5,
            )
            path = tune.save_record(result)
            print(_summary(result, path), flush=True)
            results.append(result.to_dict())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


def _progress(trial: tune.Trial) -> None:
    guess = "" if trial.predicted is None else f" (predicted {trial.predicted * 1e3:.3f} ms)"
    print(
        f"  trial {trial.index + 1:>3} {trial.schedule.key():<16} {trial.seconds * 1e3:8.3f} ms"
        f"{guess}  [{trial.elapsed_s:.0f} s]",
        flush=True,
    )


def _summary(result: tune.TuneResult, path: Path) -> str:
    rho = "n/a" if result.rank_correlation is None else f"{result.rank_correlation:.2f}"
    return (
        f"{result.op} at batch {result.batch}: best {result.best.key()} "
        f"{result.best_seconds * 1e3:.3f} ms, default {result.default_seconds * 1e3:.3f} ms "
        f"({result.speedup:.2f}x); {len(result.trials)} trials in {result.seconds:.0f} s, "
        f"95% of the best after {result.trials_to(0.95)}; cost model rank correlation {rho}; "
        f"recorded in {path}"
    )
