"""bench/pcf_gnn: PCF-GNN against the explicit statistics table.

    .venv/bin/python -m bench.pcf_gnn --datasets movielens synthetic --seeds 0 1 2 --out DIR
    .venv/bin/python -m bench.pcf_gnn --datasets cost capacity --cost-rows 1000000 --out DIR

Per dataset the training split is cut in two by a seeded row draw: part A (``--graph-fraction``)
builds the pair graph and pre-trains PCF-GNN; part B trains the ranking models; the test split
scores them. The statistics never see the rows the ranking model trains on, so a row's own label
cannot leak into its input (a table built on the same rows would hand the model its labels).

1. **Statistic prediction**: the pairs counted on B + test (held out from the graph), scored by
   the table (training smoothed CTR, the prior for unseen pairs) and by PCF-GNN; RMSE (plain and
   log(1+impressions)-weighted) and Pearson correlation against their held-out smoothed CTR, for
   all pairs and separately for pairs seen / never seen in A.
2. **Downstream AUC**: the same model and budget, trained on B: ``base``, ``+table``,
   ``+pcf_gnn``; and ``base_AB`` trained on A + B (what the rows the statistics used are worth as
   plain training data). Seeds change the model initialisation, the data order and PCF-GNN.
3. **Serving memory** of the statistics (``memory_bytes``): PCF-GNN node/relation/head floats
   plus its node vocabularies, against the table's 12 bytes per seen pair.
4. **Cost** (``cost``): graph build and pre-training time on ``--cost-rows`` synthetic rows (all
   of them, train and test), with the machine's load average beside it.
5. **Capacity** (``capacity``, seed 0): statistic prediction of PCF-GNN with 16 / 64-float nodes
   and 300 / 1,500 steps against the table, on the synthetic split.

Writes ``results.json`` under ``--out`` and prints the tables docs/pcf_gnn.md shows.
``--prepare-only`` stops after writing the data, its A/B split and the pair choice (it loads no
TensorFlow: the modules that train import it where they run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features import convert, synthetic, synthetic_config
from features.crosses.pcf_build import build_graph, count_pairs
from features.crosses.pcf_config import PCFGNNConfig
from features.crosses.pcf_graph import PairGraph, Relation
from features.schema import Schema, load_schema
from features.shard_reader import iter_record_batches, list_parquet
from pipelines.config import config_from_dict

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("STITCHREC_SHARED_DATA", ROOT.parent / "shared" / "data"))
VARIANTS = ("base", "base_AB", "table", "pcf_gnn", "pcf_gnn_small")
# statistic-prediction ablations (pre-training only): smaller node vectors, fewer layers
ABLATIONS = {"dim 8": {"dim": 8}, "layers 1": {"layers": 1}, "layers 0 (MF)": {"layers": 0}}


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _log(msg: str) -> None:
    print(msg, flush=True)


def _split_train(train_dir: Path, out: Path, fraction: float, seed: int) -> tuple[Path, Path]:
    """Cuts the training shards into A (graph, ``fraction`` of rows) and B (ranking model)."""
    a_dir, b_dir = out / "A", out / "B"
    if (out / "_SUCCESS").exists():
        return a_dir, b_dir
    a_dir.mkdir(parents=True, exist_ok=True)
    b_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, path in enumerate(list_parquet(train_dir)):
        t = pq.read_table(path)
        in_a = rng.random(t.num_rows) < fraction
        pq.write_table(t.filter(pa.array(in_a)), a_dir / f"part-{i:05d}.parquet")
        pq.write_table(t.filter(pa.array(~in_a)), b_dir / f"part-{i:05d}.parquet")
    (out / "_SUCCESS").write_text("ok")
    return a_dir, b_dir


def prepare_movielens(work: Path, fraction: float) -> dict[str, Any]:
    d = work / "movielens"
    schema = load_schema("movielens")
    if not (d / "data" / "_SUCCESS").exists():
        convert.convert(
            schema,
            [str(SHARED / "movielens-latest-small" / "ratings.csv")],
            d / "data",
            test_fraction=0.2,
            seed=0,
        )
        (d / "data" / "_SUCCESS").write_text("ok")
    schema.as_parquet().save(d / "schema.toml")
    a, b = _split_train(d / "data" / "train", d / "split", fraction, seed=0)
    return {
        "name": "movielens",
        "schema": d / "schema.toml",
        "A": a,
        "B": b,
        "test": d / "data" / "test",
        "pairs": [("userId", "movieId"), ("userId", "genres"), ("movieId", "genres")][:2],
        "model": {"type": "dcn_v2", "embedding_dim": 24, "mlp": [128, 64], "l2": 1e-4},
        "train": {"batch_size": 256, "epochs": 3, "learning_rate": 1e-3},
    }


def _synthetic_pairs(truth: dict[str, Any]) -> tuple[list[tuple], list[tuple]]:
    """(planted pairs, control pairs). Controls have no pair effect: a sub-pair of a planted
    triple (a pure third-order effect adds none to its sub-pairs) and the two smallest noise
    fields (thousands of values each: a sparse pair, where the table is large)."""
    planted = [tuple(p["fields"]) for p in truth["pairs"]]
    sizes = truth["vocab_sizes"]
    noise = sorted(truth["noise_fields"], key=lambda f: sizes[f])[:2]
    controls = [tuple(truth["triples"][0]["fields"][:2])] if truth["triples"] else []
    controls += [tuple(noise)] if len(noise) == 2 else []
    return planted, controls


def prepare_synthetic(work: Path, rows: int, fraction: float) -> dict[str, Any]:
    d = work / f"synthetic_{rows}"
    if not (d / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=0), d)
    truth = json.loads((d / "ground_truth.json").read_text())
    planted, controls = _synthetic_pairs(truth)
    a, b = _split_train(d / "train", d / "split", fraction, seed=0)
    return {
        "name": "synthetic",
        "schema": d / "schema.toml",
        "A": a,
        "B": b,
        "test": d / "test",
        "pairs": planted + controls,
        "planted": planted,
        "model": {"type": "dcn_v2", "embedding_dim": 16, "mlp": [128, 64]},
        "train": {"batch_size": 1024, "epochs": 1, "learning_rate": 1e-3},
    }


def held_out_graph(schema: Schema, graph: PairGraph, files: list[Path]) -> PairGraph:
    from features.crosses.pcf_gnn import pair_graph_like

    tables, _ = count_pairs(schema, iter_record_batches(schema, files), graph.pairs, graph.vocab)
    rels = [
        Relation(
            p,
            t.column("u").to_numpy().astype(np.int32),
            t.column("v").to_numpy().astype(np.int32),
            t.column("clicks").to_numpy(),
            t.column("impressions").to_numpy(),
        )
        for p, t in zip(graph.pairs, tables, strict=True)
    ]
    return pair_graph_like(graph, rels)


def _train_run(ds: dict[str, Any], run: Path, seed: int, variant: str, artifact: Path) -> float:
    from pipelines.train import train

    train_dirs = [str(ds["A"]), str(ds["B"])] if variant == "base_AB" else [str(ds["B"])]
    cfg: dict[str, Any] = {
        "output_dir": str(run),
        "data": {"schema": str(ds["schema"]), "train": train_dirs, "test": [str(ds["test"])]},
        "model": ds["model"],
        "train": {**ds["train"], "seed": seed, "log_every": 10_000},
    }
    if variant in ("table", "pcf_gnn", "pcf_gnn_small"):
        if variant == "pcf_gnn_small":
            artifact = artifact.parent / f"{artifact.name}_small"
        cfg["pair_stats"] = {
            "source": "table" if variant == "table" else "pcf_gnn",
            "pairs": [list(p) for p in ds["pairs"]],
            "artifact": str(artifact),
        }
    report = train(config_from_dict(cfg, base_dir=ROOT), log=lambda _: None)
    return float(report["test"]["auc"])


def _mean_std(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def run_dataset(
    ds: dict[str, Any], seeds: list[int], work: Path, gnn: dict[str, Any], small_dim: int
) -> dict:
    from features.crosses.pcf_gnn import evaluate_pairs, pretrain
    from pipelines.run.model import table_layer
    from ranking.pair_stats import PairStatsGNN

    schema = load_schema(ds["schema"])
    name = ds["name"]
    t0 = time.time()
    graph = build_graph(schema, list_parquet(ds["A"]), ds["pairs"], log=_log)
    graph_seconds = time.time() - t0
    held = held_out_graph(schema, graph, list_parquet([ds["B"], ds["test"]]))
    table_metrics = evaluate_pairs(None, held, graph)
    out: dict[str, Any] = {
        "pairs": [list(p) for p in ds["pairs"]],
        "graph": {
            "rows": graph.rows,
            "nodes": graph.num_nodes,
            "edges": graph.num_edges,
            "seconds": round(graph_seconds, 2),
        },
        "statistic": {"table": table_metrics, "pcf_gnn": [], "ablations": {}},
        "auc": {v: [] for v in VARIANTS},
        "load": [],
    }
    memory: dict[str, Any] = {}
    for seed in seeds:
        art_dir = work / f"{name}_artifact_{seed}"
        t1 = time.time()
        art = pretrain(graph, PCFGNNConfig(**{**gnn, "seed": seed}), log=_log)
        art.save(art_dir, graph)
        out.setdefault("pretrain_seconds", []).append(round(time.time() - t1, 2))
        out["statistic"]["pcf_gnn"].append(evaluate_pairs(art, held, graph))
        small = pretrain(graph, PCFGNNConfig(**{**gnn, "seed": seed, "dim": small_dim}))
        small.save(work / f"{name}_artifact_{seed}_small", graph)
        if not memory:
            memory = {
                "table": table_layer(graph, ds["pairs"]).memory_bytes(),
                "pcf_gnn": PairStatsGNN.from_artifact(art, ds["pairs"]).memory_bytes(),
                "pcf_gnn_small": PairStatsGNN.from_artifact(small, ds["pairs"]).memory_bytes(),
            }
        entry = out["statistic"]["ablations"].setdefault(f"dim {small_dim}", {"metrics": []})
        entry["metrics"].append(evaluate_pairs(small, held, graph))
        entry["memory"] = memory["pcf_gnn_small"]
        for label, change in ABLATIONS.items():
            abl = pretrain(graph, PCFGNNConfig(**{**gnn, "seed": seed, **change}))
            entry = out["statistic"]["ablations"].setdefault(label, {"metrics": []})
            entry["metrics"].append(evaluate_pairs(abl, held, graph))
            entry["memory"] = PairStatsGNN.from_artifact(abl, ds["pairs"]).memory_bytes()
        for variant in VARIANTS:
            auc = _train_run(ds, work / f"{name}_run_{variant}_{seed}", seed, variant, art_dir)
            out["auc"][variant].append(auc)
            out["load"].append(_load())
            _log(f"{name} seed {seed} {variant}: test AUC {auc:.4f} (load {_load()})")
    out["memory"] = memory
    out["auc_summary"] = {v: _mean_std(a) for v, a in out["auc"].items()}
    out["statistic_summary"] = _summary(out["statistic"]["pcf_gnn"])
    for entry in out["statistic"]["ablations"].values():
        entry["summary"] = _summary(entry["metrics"])
    return out


def _summary(gm: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        part: {
            key: _mean_std([m[part][key] for m in gm])
            for key in ("rmse", "weighted_rmse", "pearson")
        }
        | {"pairs": gm[0][part]["pairs"]}
        for part in ("all", "seen", "unseen")
    }


def run_cost(work: Path, rows: int, gnn: dict[str, Any]) -> dict[str, Any]:
    from features.crosses.pcf_gnn import pretrain

    d = work / f"synthetic_{rows}"
    if not (d / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=0), d)
    planted, controls = _synthetic_pairs(json.loads((d / "ground_truth.json").read_text()))
    pairs = planted + controls
    schema = load_schema(d / "schema.toml")
    files = list_parquet([d / "train", d / "test"])  # all generated rows
    load_before = _load()
    t0 = time.time()
    graph = build_graph(schema, files, pairs, log=_log)
    t_graph = time.time() - t0
    t1 = time.time()
    art = pretrain(graph, PCFGNNConfig(**gnn), log=_log)
    t_pre = time.time() - t1
    return {
        "rows": graph.rows,
        "pairs": [list(p) for p in pairs],
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "graph_seconds": round(t_graph, 2),
        "pretrain_seconds": round(t_pre, 2),
        "total_seconds": round(t_graph + t_pre, 2),
        "target_seconds": 600,
        "cpu_count": os.cpu_count(),
        "tf_threads": "default",
        "load_before": load_before,
        "load_after": _load(),
        "final_loss": art.history[-1]["loss"] if art.history else math.nan,
    }


def run_capacity(ds: dict[str, Any], work: Path, gnn: dict[str, Any]) -> dict[str, Any]:
    """Statistic prediction only (seed 0): does more capacity or training close the gap to the
    table on seen pairs? Node size x steps, against the table, per pair."""
    from features.crosses.pcf_gnn import evaluate_pairs, pretrain
    from pipelines.run.model import table_layer
    from ranking.pair_stats import PairStatsGNN

    schema = load_schema(ds["schema"])
    graph = build_graph(schema, list_parquet(ds["A"]), ds["pairs"], log=_log)
    held = held_out_graph(schema, graph, list_parquet([ds["B"], ds["test"]]))
    out: dict[str, Any] = {"table": evaluate_pairs(None, held, graph), "runs": []}
    for dim, steps in ((16, 300), (16, 1500), (64, 300), (64, 1500)):
        t0 = time.time()
        art = pretrain(graph, PCFGNNConfig(**{**gnn, "dim": dim, "steps": steps}))
        out["runs"].append(
            {
                "dim": dim,
                "steps": steps,
                "seconds": round(time.time() - t0, 1),
                "metrics": evaluate_pairs(art, held, graph),
                "bytes": PairStatsGNN.from_artifact(art, ds["pairs"]).memory_bytes()["total"],
                "final_loss": art.history[-1]["loss"],
            }
        )
        m = out["runs"][-1]["metrics"]
        _log(
            f"capacity dim {dim} steps {steps}: seen rmse {m['seen']['rmse']:.4f} pearson "
            f"{m['seen']['pearson']:.4f}; unseen rmse {m['unseen']['rmse']:.4f} (load {_load()})"
        )
    out["table_bytes"] = table_layer(graph, ds["pairs"]).memory_bytes()["total"]
    return out


def _fmt(s: dict[str, float], digits: int = 4) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def print_tables(results: dict[str, Any]) -> None:
    for name, r in results.get("datasets", {}).items():
        print(f"\n## {name}: pairs {r['pairs']}; graph {r['graph']}")
        print(
            "| pairs | held-out pairs | table RMSE | PCF-GNN RMSE | table Pearson | PCF-GNN Pearson |"
        )
        print("|---|---|---|---|---|---|")
        for part in ("all", "seen", "unseen"):
            t = r["statistic"]["table"][part]
            g = r["statistic_summary"][part]
            print(
                f"| {part} | {t['pairs']:,} | {t['rmse']:.4f} | {_fmt(g['rmse'])} | "
                f"{t['pearson']:.4f} | {_fmt(g['pearson'])} |"
            )
        print("\n| PCF-GNN variant | serving bytes | RMSE all | RMSE unseen | Pearson unseen |")
        print("|---|---|---|---|---|")
        variants = {"dim 16, 2 layers": (r["statistic_summary"], r["memory"]["pcf_gnn"])}
        for label, e in r["statistic"]["ablations"].items():
            variants[label] = (e["summary"], e["memory"])
        for label, (sm, mem) in variants.items():
            print(
                f"| {label} | {mem['total']:,} | {_fmt(sm['all']['rmse'])} | "
                f"{_fmt(sm['unseen']['rmse'])} | {_fmt(sm['unseen']['pearson'])} |"
            )
        print("\n| model | test AUC (mean ± std) |")
        print("|---|---|")
        for v in VARIANTS:
            print(f"| {v} | {_fmt(r['auc_summary'][v])} |")
        m = r["memory"]
        table_bytes = max(m["table"]["total"], 1)
        print(f"\nmemory: table {m['table']['total']:,} B")
        for key in ("pcf_gnn", "pcf_gnn_small"):
            print(
                f"memory: {key} {m[key]['total']:,} B (parameters {m[key]['parameters']:,} + "
                f"vocabulary {m[key]['vocabulary']:,}); ratio to table "
                f"{m[key]['total'] / table_bytes:.3f} (parameters only "
                f"{m[key]['parameters'] / table_bytes:.3f})"
            )
    if "cost" in results:
        print(f"\ncost: {results['cost']}")
    if "capacity" in results:
        c = results["capacity"]
        t = c["table"]
        print("\n| synthetic, seed 0 | bytes | seen RMSE | seen Pearson | unseen RMSE |")
        print("|---|---|---|---|---|")
        print(
            f"| table | {c['table_bytes']:,} | {t['seen']['rmse']:.4f} | "
            f"{t['seen']['pearson']:.4f} | {t['unseen']['rmse']:.4f} |"
        )
        for r in c["runs"]:
            m = r["metrics"]
            print(
                f"| PCF-GNN dim {r['dim']}, {r['steps']} steps | {r['bytes']:,} | "
                f"{m['seen']['rmse']:.4f} | {m['seen']['pearson']:.4f} | {m['unseen']['rmse']:.4f} |"
            )


def prepare_only(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The prepared movielens / synthetic datasets of ``--datasets`` (others are skipped)."""
    prepared: dict[str, Any] = {}
    for name in args.datasets:
        if name == "movielens":
            ds = prepare_movielens(work, args.graph_fraction)
        elif name == "synthetic":
            ds = prepare_synthetic(work, args.synthetic_rows, args.graph_fraction)
        else:
            _log(f"== {name}: skipped (--prepare-only)")
            continue
        prepared[name] = {k: v for k, v in ds.items() if k not in ("model", "train")}
        _log(f"== {name}: A {ds['A']}, B {ds['B']}, pairs {ds['pairs']}")
    return prepared


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pcf_gnn", description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", default=["movielens", "synthetic", "cost"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--synthetic-rows", type=int, default=400_000)
    p.add_argument("--cost-rows", type=int, default=1_000_000)
    p.add_argument("--graph-fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--small-dim", type=int, default=4, help="node size of pcf_gnn_small")
    p.add_argument("--work", default="runs/bench_pcf_gnn")
    p.add_argument("--out", default="runs/bench_pcf_gnn")
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="only write the data, its A/B split and the pair choice of movielens / synthetic "
        "(results.json: 'prepared'), no graph or training",
    )
    args = p.parse_args(argv)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gnn = {"steps": args.steps, "batch_edges": 8192, "log_every": 100}
    results: dict[str, Any] = {
        "seeds": args.seeds,
        "graph_fraction": args.graph_fraction,
        "pcf_gnn": gnn,
        "small_dim": args.small_dim,
        "cpu_count": os.cpu_count(),
        "datasets": {},
    }
    started = time.time()
    if args.prepare_only:
        results["prepared"] = prepare_only(args, work)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        _log(f"results: {out / 'results.json'}")
        return 0
    for name in args.datasets:
        _log(f"== {name} (load {_load()})")
        if name == "cost":
            results["cost"] = run_cost(work, args.cost_rows, gnn)
        elif name == "capacity":
            ds = prepare_synthetic(work, args.synthetic_rows, args.graph_fraction)
            results["capacity"] = run_capacity(ds, work, gnn)
        else:
            ds = (
                prepare_movielens(work, args.graph_fraction)
                if name == "movielens"
                else prepare_synthetic(work, args.synthetic_rows, args.graph_fraction)
            )
            results["datasets"][name] = run_dataset(ds, args.seeds, work, gnn, args.small_dim)
        results["seconds"] = round(time.time() - started, 1)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print_tables(results)
    _log(f"results: {out / 'results.json'} ({results['seconds']}s, load {_load()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
