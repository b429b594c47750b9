"""``stitchrec crosses pcf-gnn --config FILE``: build the pair graph and pre-train PCF-GNN.

The config is a training config (``pipelines.config``) with a ``[pair_stats]`` section::

    [pair_stats]
    source = "pcf_gnn"                     # or "table": the explicit statistics baseline
    pairs = [["userId", "movieId"], ["userId", "genres"]]
    # artifact = "runs/movielens/pcf_gnn"  # default: <output_dir>/pcf_gnn
    # graph_data = ["logs/earlier"]        # default: the training split
    min_count = 1
    steps = 300

The command converts the config's data like ``stitchrec train`` does (into the same run folder,
so training reuses it), builds the graph (``features.crosses.pcf_build.build_graph``) from the training
split or ``graph_data``, pre-trains (``features.crosses.pcf_gnn.pretrain``) and writes the artifact:
``pcf_gnn.json`` + ``pcf_gnn.npz`` (vocabularies, cached node vectors, relation vectors, head),
``graph/`` (the pair counts; the table baseline reads them) and ``report.json``.
``stitchrec train`` with the same config then adds the pair statistics as dense model inputs
(``pipelines.run.model.pair_stats_layer``), computed inside the exported SavedModel from raw features.
The flags are defined in ``pipelines.cli_args``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from features.crosses.pcf_artifact import ARTIFACT_FILE
from features.crosses.pcf_build import build_graph
from features.crosses.pcf_gnn import pretrain
from features.schema import FeatureKind
from features.shard_reader import list_parquet
from pipelines.config import ConfigError, load_config
from pipelines.engines import engine_config, open_runner
from pipelines.errors import UsageError, check_output_path
from pipelines.run.data import prepare_data
from pipelines.run.paths import RunPaths

REPORT_FILE = "report.json"


def _print(msg: str) -> None:
    print(msg, flush=True)


def cmd_pcf_gnn(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, list(args.set))
    engine = engine_config(args, cfg.engine)
    report = run_pcf_gnn(dataclasses.replace(cfg, engine=engine), log=_print)
    _print(
        f"pcf-gnn artifact: {report['artifact']} ({report['nodes']:,} nodes, "
        f"{report['edges']:,} edges, graph {report['graph_seconds']:.1f}s, "
        f"pre-training {report['pretrain_seconds']:.1f}s)"
    )
    return 0


def _check_pairs(schema: Any, pairs: Any) -> None:
    """Raises ConfigError for a ``[pair_stats] pairs`` entry the schema cannot pair."""
    for p in pairs:
        for f in p:
            if f not in schema.names:
                raise ConfigError(
                    f"[pair_stats] pairs: {f!r} is not a field of schema {schema.name!r}; "
                    f"fields: {schema.names}"
                )
            kind = schema.field(f).kind
            if kind not in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL):
                raise ConfigError(
                    f"[pair_stats] pairs: {list(p)}: {f!r} is {kind.value}; pairs need "
                    f"categorical or multi_categorical fields"
                )
        kinds = [schema.field(f).kind for f in p]
        if kinds.count(FeatureKind.MULTI_CATEGORICAL) == 2:
            raise ConfigError(
                f"[pair_stats] pairs: {list(p)}: at most one field of a pair may be "
                "multi_categorical"
            )


def _check_artifact_dir(out: Path) -> None:
    """Raises UsageError when the artifact folder ``out`` cannot be written: a file, or a
    folder holding files that are not an earlier artifact (no ``pcf_gnn.json``), which the
    command's files would be mixed into."""
    check_output_path(out, "[pair_stats] artifact")
    if out.is_dir() and any(out.iterdir()) and not (out / ARTIFACT_FILE).is_file():
        raise UsageError(
            f"[pair_stats] artifact {str(out)!r} holds files that are not a `stitchrec crosses "
            f"pcf-gnn` artifact (no {ARTIFACT_FILE}): expected a new or empty folder, or an "
            "earlier pcf-gnn artifact (whose files are overwritten)"
        )


def _check_edges(graph: Any, ps: Any) -> None:
    """Raises ConfigError naming the setting that left the pair graph without edges."""
    if graph.num_edges:
        return
    dropped = sum(graph.report["edges_below_min_impressions"].values())
    if dropped:
        raise ConfigError(
            f"[pair_stats] min_impressions = {ps.min_impressions:,} drops all {dropped:,} edges "
            f"of the pairs {[list(p) for p in ps.pairs]} (counted over {graph.rows:,} rows), "
            "leaving no edges to pre-train on: expected a lower min_impressions (default 1: "
            "every edge kept)"
        )
    raise ConfigError(
        f"[pair_stats] pairs {[list(p) for p in ps.pairs]}: no row of the graph data "
        f"({graph.rows:,} rows) has values of both fields of a pair, so the pair graph has no "
        "edges to pre-train on: expected pairs of fields that are present together"
    )


def run_pcf_gnn(cfg: Any, log: Any = _print) -> dict[str, Any]:
    """Builds the graph and pre-trains PCF-GNN for ``cfg`` (a ``PipelineConfig``); returns the
    report also written to ``<artifact>/report.json``."""
    ps = cfg.pair_stats
    if ps is None:
        raise ConfigError(
            'the config has no [pair_stats] section; add one with `pairs = [["a", "b"]]`'
        )
    out = Path(ps.artifact_dir(cfg.output_dir))
    _check_artifact_dir(out)  # before the graph and the pre-training
    paths = RunPaths(Path(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    with open_runner(cfg.engine, log) as runner:
        schema, train_files, _, _ = prepare_data(cfg, paths, log, runner)
        files = list_parquet(list(ps.graph_data)) if ps.graph_data else train_files
        _check_pairs(schema, ps.pairs)
        t0 = time.time()
        graph = build_graph(
            schema,
            files,
            [tuple(p) for p in ps.pairs],
            min_count=ps.min_count,
            max_nodes=ps.max_nodes or None,
            alpha=float(ps.alpha),
            min_impressions=ps.min_impressions,
            log=log,
            runner=runner,
        )
    graph_seconds = time.time() - t0
    _check_edges(graph, ps)  # before the pre-training, which needs edges
    gnn = ps.gnn()
    t1 = time.time()
    artifact = pretrain(graph, gnn, log=log)
    pretrain_seconds = time.time() - t1
    artifact.save(out, graph)
    report = {
        "artifact": str(out),
        "rows": graph.rows,
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "edges_per_pair": {r.name: len(r) for r in graph.relations},
        "prior": graph.prior,
        "graph": graph.report,
        "graph_seconds": round(graph_seconds, 2),
        "pretrain_seconds": round(pretrain_seconds, 2),
        "config": dataclasses.asdict(gnn),
        "history": artifact.history,
        "serving_bytes": artifact.serving_bytes(),
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1))
    return report
