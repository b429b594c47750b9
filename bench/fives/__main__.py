"""bench/fives: FIVES cross search against planted ground truth, downstream and as a predictor.

    .venv/bin/python -m bench.fives --out runs/bench_fives/fives.json                  # everything
    .venv/bin/python -m bench.fives --rows 200000 --seeds 0 --skip-movielens        # a quick run
    .venv/bin/python -m bench.fives --timing --out runs/bench_fives/fives_timing.json  # 1M rows, timed

For each synthetic seed (``features.synthetic``: 13 numeric + 26 categorical fields, 3 planted
pure pairs and 2 planted pure triples by default) it

1. runs the FIVES search on the training split (``--rows`` rows in all, 80% train) and times it,
   beside the machine load (``os.getloadavg``) and core count;
2. scores the ranked crosses against the planted ones: precision and recall of the top
   ``N = 2 x planted``, and the rank of each planted cross (a planted cross matches only the
   cross with exactly its fields, so its order must be right); both the final ranking (FIVES
   plus the interaction screen, ``ground_truth``) and the edge search's own ranking (the
   paper's read-out, ``ground_truth_edges``);
3. downstream (the paper's Table 3 form, relative AUC gain over plain LR on the test split): LR
   and xgboost without crosses, with the FIVES top-N (``fives``: the final ranking;
   ``fives_edges``: the edge search alone), with N random crosses of the same orders,
   and with the N best pairs by pairwise interaction information (CMI-like; Miller-Madow
   corrected). LR is scikit-learn's L2 logistic regression on one-hot field values plus one-hot
   cross values (value tuples seen twice in training, others in one "other" column); xgboost
   (hist, 100 trees of depth 6) reads the same one-hot columns, each field and cross capped at its
   ``--xgb-cap`` most frequent values (default 100: wider one-hot on 49 columns took minutes a fit
   on 2 cores; MovieLens, 7 columns, was run with 1000). Both train on
   ``--downstream-rows`` training rows. ``planted`` (synthetic only) adds the planted crosses
   themselves: what a perfect search would give;
4. FIVES as a predictor (Table 2 form): test AUC of the searched network against our DNN and
   DCN-v2 trained by ``pipelines.train`` on the same training rows (one epoch).

MovieLens (``configs/movielens.toml`` data, its random 80/20 split; userId, movieId, genres as
one value, rating_time in 10 quantile buckets) gets steps 1, 3 and 4 with ``N = 3``; its seeds
are the search, random-cross and model seeds. Results: JSON at ``--out``, tables on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features import synthetic, synthetic_config
from features.crosses import fives_config, fives_encoding, fives_search
from features.crosses.cross_columns import feature_columns, mi_pairs, one_hot
from features.dataset import list_parquet
from features.schema import Schema, load_schema
from ranking.metrics import auc

ROOT = Path(__file__).resolve().parents[2]
MOVIELENS = ROOT.parent / "shared" / "data" / "movielens-latest-small"
METHODS = ("none", "fives", "fives_edges", "random", "mi", "planted")
XGB_CAP = 100  # xgboost one-hot columns per field or cross: its most frequent values


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def mean_std(values: list[float]) -> dict[str, float]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {"mean": statistics.fmean(vals), "std": std, "n": len(vals)}


# ---------------------------------------------------------------------------------------------
# Cross features for the downstream models
# ---------------------------------------------------------------------------------------------


def fit_lr(tr, te, card, y_tr, y_te, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=0.5, solver="liblinear", max_iter=200, random_state=seed)
    model.fit(one_hot(tr, card), y_tr)
    return auc(y_te, model.predict_proba(one_hot(te, card))[:, 1])


def fit_xgb(tr, te, card, y_tr, y_te, seed: int) -> float:
    import xgboost as xgb

    model = xgb.XGBClassifier(
        n_estimators=100,
        max_depth=6,
        learning_rate=0.1,
        tree_method="hist",
        n_jobs=2,
        random_state=seed,
    )
    model.fit(one_hot(tr, card), y_tr)
    return auc(y_te, model.predict_proba(one_hot(te, card))[:, 1])


def random_crosses(
    num_fields: int, orders: list[int], seed: int, exclude: set[frozenset[int]]
) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    seen = set(exclude)
    for order in orders:
        while True:
            cols = sorted(int(c) for c in rng.choice(num_fields, order, replace=False))
            if frozenset(cols) not in seen:
                seen.add(frozenset(cols))
                out.append(cols)
                break
    return out


def downstream(
    result: fives_search.FivesResult,
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    top_n: int,
    seed: int,
    log: Any,
    planted: list[list[str]] | None = None,
    xgb_cap: int = XGB_CAP,
) -> dict[str, dict[str, float]]:
    enc = result.encoder
    col = {n: i for i, n in enumerate(enc.fields)}
    sizes = enc.vocab_sizes
    found = [[col[f] for f in c.fields] for c in result.crosses[:top_n]]
    sets = {
        "none": [],
        "fives": found,
        "fives_edges": [[col[f] for f in c.fields] for c in result.edge_crosses[:top_n]],
        "random": random_crosses(
            len(enc.fields), [len(c) for c in found], seed, {frozenset(c) for c in found}
        ),
        "mi": mi_pairs(x_tr[:200_000], y_tr[:200_000], sizes, top_n),
    }
    if planted:
        sets["planted"] = [[col[f] for f in fields] for fields in planted]
    out: dict[str, dict[str, float]] = {}
    for name, crosses in sets.items():
        t0 = time.time()
        tr, te, card = feature_columns(x_tr, x_te, sizes, crosses)
        lr = fit_lr(tr, te, card, y_tr, y_te, seed)
        tr, te, card = feature_columns(x_tr, x_te, sizes, crosses, cap=xgb_cap)
        xg = fit_xgb(tr, te, card, y_tr, y_te, seed)
        names = ["x".join(enc.fields[c] for c in cols) for cols in crosses]
        out[name] = {"lr_auc": lr, "xgb_auc": xg, "crosses": names}
        log(
            f"  downstream {name:<6s} LR auc {lr:.4f}  xgboost auc {xg:.4f} ({time.time() - t0:.0f}s)"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Reference models through the pipeline (Table 2)
# ---------------------------------------------------------------------------------------------


def pipeline_auc(
    schema_path: Path, train: Path, test: Path, model_type: str, seed: int, work: Path
) -> float:
    from pipelines.config import DataConfig, PipelineConfig, TrainConfig
    from pipelines.train import train as run_train
    from ranking.config import ModelConfig

    cfg = PipelineConfig(
        output_dir=str(work / f"{model_type}_{seed}"),
        data=DataConfig(schema=str(schema_path), train=(str(train),), test=(str(test),)),
        model=ModelConfig(type=model_type, embedding_dim=16, mlp=(128, 64), cross_layers=2),
        train=TrainConfig(
            batch_size=1024, epochs=1, learning_rate=1e-3, seed=seed, log_every=10**6
        ),
    )
    return float(run_train(cfg, log=lambda _: None)["test"]["auc"])


def write_parquet(table: pa.Table, path: Path) -> Path:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def planted_scores(crosses: list[Any], truth: dict[str, Any]) -> dict[str, Any]:
    planted = [frozenset(c["fields"]) for c in truth["pairs"] + truth["triples"]]
    keys = [c.key for c in crosses]
    n = 2 * len(planted)
    top = keys[:n]
    hits = [p for p in planted if p in top]
    ranks = {"x".join(sorted(p)): (keys.index(p) + 1 if p in keys else None) for p in planted}
    return {
        "planted": len(planted),
        "top_n": n,
        "precision": len(hits) / n,
        "recall": len(hits) / len(planted),
        "recall_pairs": sum(frozenset(c["fields"]) in top for c in truth["pairs"])
        / max(len(truth["pairs"]), 1),
        "recall_triples": sum(frozenset(c["fields"]) in top for c in truth["triples"])
        / max(len(truth["triples"]), 1),
        "all_in_top": len(hits) == len(planted),
        "ranks": ranks,
    }


def synthetic_split(
    work: Path, rows: int, seed: int
) -> tuple[Path, Schema, dict[str, Any], pa.Table]:
    """The synthetic set of ``rows`` rows and ``seed`` under ``work`` (written once): its folder,
    schema, ground truth and training split."""
    data = work / f"synthetic_{rows}_{seed}"
    if not (data / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=seed), data)
    schema = load_schema(data / "schema.toml")
    truth = json.loads((data / "ground_truth.json").read_text())
    return data, schema, truth, fives_encoding.read_table(schema, list_parquet(data / "train"))


def run_synthetic(args: argparse.Namespace, seed: int, work: Path, log: Any) -> dict[str, Any]:
    data, schema, truth, train = synthetic_split(work, args.rows, seed)
    test = fives_encoding.read_table(schema, list_parquet(data / "test"))
    cfg = fives_config.FivesConfig(seed=seed, epochs=args.epochs)
    load_before = _load()
    result = fives_search.search(schema, train, cfg, log=log)
    entry: dict[str, Any] = {
        "seed": seed,
        "rows": {"train": train.num_rows, "test": test.num_rows},
        "fields": len(result.encoder.fields),
        "search_seconds": round(result.seconds, 1),
        "load_before": load_before,
        "load_after": _load(),
        "history": result.history,
        "screen": result.screen,
        "top": [(c.name, c.source, c.effect) for c in result.crosses[:15]],
        "ground_truth": planted_scores(result.crosses, truth),
        "ground_truth_edges": planted_scores(result.edge_crosses, truth),
    }
    log(f"seed {seed}: ground truth {json.dumps(entry['ground_truth'])}")
    log(f"seed {seed}: edge search alone {json.dumps(entry['ground_truth_edges'])}")
    y_tr = train.column("label").to_numpy()
    y_te = test.column("label").to_numpy()
    x_te = result.encoder.transform(test)
    entry["fives_test_auc"] = auc(y_te, result.predict(x_te))
    if not args.skip_downstream:
        n = args.downstream_rows
        sub = train.slice(0, n)
        x_tr = result.encoder.transform(sub)
        entry["downstream"] = downstream(
            result,
            x_tr,
            y_tr[:n],
            x_te,
            y_te,
            entry["ground_truth"]["top_n"],
            seed,
            log,
            planted=[c["fields"] for c in truth["pairs"] + truth["triples"]],
            xgb_cap=args.xgb_cap,
        )
        entry["downstream_train_rows"] = sub.num_rows
        if not args.skip_reference:
            sub_path = write_parquet(sub, work / f"sub_{args.rows}_{seed}" / "part-0.parquet")
            for m in ("dnn", "dcn_v2"):
                entry[f"{m}_test_auc"] = pipeline_auc(
                    data / "schema.toml", sub_path.parent, data / "test", m, seed, work / "runs"
                )
            # FIVES as a predictor on the same rows as the reference models
            small = fives_search.search(  # the predictor does not use the screen
                schema,
                sub,
                fives_config.FivesConfig(seed=seed, epochs=args.epochs, screen_orders=()),
                log=lambda _: None,
            )
            entry["fives_sub_test_auc"] = auc(y_te, small.predict(small.encoder.transform(test)))
            log(
                f"seed {seed}: test auc FIVES {entry['fives_sub_test_auc']:.4f} "
                f"DNN {entry['dnn_test_auc']:.4f} DCN-v2 {entry['dcn_v2_test_auc']:.4f} "
                f"(on {sub.num_rows:,} training rows)"
            )
    entry["oracle_auc"] = truth.get("observed", {}).get("oracle_auc")
    return entry


def run_timing(args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    """The search on every row of the seed-0 synthetic set (train + test: ``--rows`` rows, 39
    fields), timed end to end (encoding included), with the load before and after."""
    data = work / f"synthetic_{args.rows}_0"
    if not (data / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=args.rows, seed=0), data)
    schema = load_schema(data / "schema.toml")
    files = list_parquet(data / "train") + list_parquet(data / "test")
    t0 = time.time()
    table = fives_encoding.read_table(schema, files)
    read_seconds = time.time() - t0
    load_before = _load()
    result = fives_search.search(
        schema, table, fives_config.FivesConfig(epochs=args.epochs), log=log
    )
    entry = {
        "rows": table.num_rows,
        "fields": len(result.encoder.fields),
        "read_seconds": round(read_seconds, 1),
        "search_seconds": round(result.seconds, 1),
        "epoch_seconds": [h["seconds"] for h in result.history],
        "screen_seconds": result.screen.get("seconds"),
        "load_before": load_before,
        "load_after": _load(),
        "cpus": os.cpu_count(),
        "target_seconds": 600,
    }
    log(f"timing: {json.dumps(entry)}")
    return entry


def movielens_data(work: Path) -> tuple[Schema, Path, Path, Path]:
    from pipelines.config import load_config
    from pipelines.run.data import prepare_data
    from pipelines.run.paths import RunPaths

    cfg = load_config(ROOT / "configs" / "movielens.toml")
    paths = RunPaths(work / "movielens")
    paths.root.mkdir(parents=True, exist_ok=True)
    schema, _, _, _ = prepare_data(cfg, paths, log=lambda _: None)
    schema.save(paths.root / "schema.toml")
    return schema, paths.root / "schema.toml", paths.data / "train", paths.data / "test"


def run_movielens(args: argparse.Namespace, seed: int, work: Path, log: Any) -> dict[str, Any]:
    schema, schema_path, train_dir, test_dir = movielens_data(work)
    train = fives_encoding.read_table(schema, list_parquet(train_dir))
    test = fives_encoding.read_table(schema, list_parquet(test_dir))
    cfg = fives_config.FivesConfig(seed=seed, epochs=args.epochs, batch_size=512)
    result = fives_search.search(schema, train, cfg, log=log)
    y_tr, y_te = train.column("label").to_numpy(), test.column("label").to_numpy()
    x_tr, x_te = result.encoder.transform(train), result.encoder.transform(test)
    entry: dict[str, Any] = {
        "seed": seed,
        "rows": {"train": train.num_rows, "test": test.num_rows},
        "search_seconds": round(result.seconds, 1),
        "top": [(c.name, c.source, c.effect) for c in result.crosses[:10]],
        "fives_test_auc": auc(y_te, result.predict(x_te)),
        "downstream": downstream(
            result, x_tr, y_tr, x_te, y_te, 3, seed, log, xgb_cap=args.xgb_cap
        ),
    }
    if not args.skip_reference:
        for m in ("dnn", "dcn_v2"):
            entry[f"{m}_test_auc"] = pipeline_auc(
                schema_path, train_dir, test_dir, m, seed, work / "runs_ml"
            )
    return entry


def relative_gains(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± std over seeds of 100 * (AUC / AUC of plain LR - 1), per model and method."""
    out: dict[str, Any] = {}
    for model in ("lr", "xgb"):
        for method in METHODS:
            if not all(method in e.get("downstream", {}) for e in entries):
                continue
            gains = [
                100
                * (e["downstream"][method][f"{model}_auc"] / e["downstream"]["none"]["lr_auc"] - 1)
                for e in entries
                if "downstream" in e
            ]
            aucs = [e["downstream"][method][f"{model}_auc"] for e in entries if "downstream" in e]
            out[f"{method}+{model}"] = {"gain_pct": mean_std(gains), "auc": mean_std(aucs)}
    return out


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    syn = results.get("synthetic", [])
    if syn:
        gt = [e["ground_truth"] for e in syn]
        edges = [e.get("ground_truth_edges") for e in syn]
        summary["synthetic"] = {
            "precision": mean_std([g["precision"] for g in gt]),
            "recall": mean_std([g["recall"] for g in gt]),
            "recall_pairs": mean_std([g["recall_pairs"] for g in gt]),
            "recall_triples": mean_std([g["recall_triples"] for g in gt]),
            "all_planted_in_top_2n": sum(g["all_in_top"] for g in gt),
            "edges_alone": None
            if None in edges
            else {
                "recall_pairs": mean_std([g["recall_pairs"] for g in edges]),
                "recall_triples": mean_std([g["recall_triples"] for g in edges]),
                "all_planted_in_top_2n": sum(g["all_in_top"] for g in edges),
            },
            "search_seconds": mean_std([e["search_seconds"] for e in syn]),
            "fives_test_auc": mean_std([e["fives_test_auc"] for e in syn]),
            "table3": relative_gains(syn),
        }
        for key in ("fives_sub_test_auc", "dnn_test_auc", "dcn_v2_test_auc", "oracle_auc"):
            summary["synthetic"][key] = mean_std([e.get(key) for e in syn])
    ml = results.get("movielens", [])
    if ml:
        summary["movielens"] = {
            "search_seconds": mean_std([e["search_seconds"] for e in ml]),
            "table3": relative_gains(ml),
        }
        for key in ("fives_test_auc", "dnn_test_auc", "dcn_v2_test_auc"):
            summary["movielens"][key] = mean_std([e.get(key) for e in ml])
    return summary


def print_tables(summary: dict[str, Any]) -> None:
    def fmt(ms: dict[str, float], digits: int = 4) -> str:
        return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f}"

    for ds, s in summary.items():
        print(f"\n{ds}: relative AUC gain over plain LR (%), mean ± std over seeds")
        for key, v in s["table3"].items():
            print(f"  {key:<12s} gain {fmt(v['gain_pct'], 3):>18s}   auc {fmt(v['auc'])}")
        print(
            f"  predictors: FIVES {fmt(s.get('fives_sub_test_auc') or s['fives_test_auc'])}  "
            f"DNN {fmt(s['dnn_test_auc'])}  DCN-v2 {fmt(s['dcn_v2_test_auc'])}"
        )
        if ds == "synthetic":
            print(
                f"  ground truth: precision {fmt(s['precision'], 2)} recall {fmt(s['recall'], 2)} "
                f"(pairs {fmt(s['recall_pairs'], 2)}, triples {fmt(s['recall_triples'], 2)}); "
                f"all planted in top 2N for {s['all_planted_in_top_2n']} seed(s); search "
                f"{fmt(s['search_seconds'], 1)} s"
            )
            if s.get("edges_alone"):
                e = s["edges_alone"]
                print(
                    f"  edge search alone: pairs {fmt(e['recall_pairs'], 2)}, triples "
                    f"{fmt(e['recall_triples'], 2)}; all planted in top 2N for "
                    f"{e['all_planted_in_top_2n']} seed(s)"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/bench_fives/fives.json")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows (80%% train)")
    p.add_argument("--downstream-rows", type=int, default=200_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=fives_config.FivesConfig().epochs)
    p.add_argument("--xgb-cap", type=int, default=XGB_CAP, help="xgboost one-hot values per column")
    p.add_argument("--timing", action="store_true", help="only the timed search on all rows")
    p.add_argument(
        "--merge", nargs="+", default=None, help="result files of separate runs: merge, summarize"
    )
    p.add_argument("--skip-movielens", action="store_true")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--skip-downstream", action="store_true")
    p.add_argument("--skip-reference", action="store_true", help="no DNN / DCN-v2 runs")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        merged: dict[str, Any] = {"merged_from": args.merge, "parts": [p["machine"] for p in parts]}
        for key in ("synthetic", "movielens"):
            entries = [e for part in parts for e in part.get(key, [])]
            if entries:
                merged[key] = sorted(entries, key=lambda e: e["seed"])
        merged["timing"] = next((p["timing"] for p in parts if "timing" in p), None)
        merged["summary"] = summarize(merged)
        out.write_text(json.dumps(merged, indent=1, default=float) + "\n")
        print_tables(merged["summary"])
        log(f"\nwrote {out}")
        return 0
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_fives_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_at_start": _load()},
        "args": vars(args),
    }
    if args.timing:
        results["timing"] = run_timing(args, work, log)
        out.write_text(json.dumps(results, indent=1, default=float) + "\n")
        return 0
    runs = []
    if not args.skip_synthetic:
        runs.append(("synthetic", run_synthetic))
    if not args.skip_movielens and not args.skip_downstream:
        if MOVIELENS.exists():
            runs.append(("movielens", run_movielens))
        else:
            log(
                f"MovieLens skipped: {MOVIELENS} does not exist (run from a checkout beside ../shared)"
            )
    for key, fn in runs:
        results[key] = []
        for seed in args.seeds:
            results[key].append(fn(args, seed, work, log))
            out.write_text(json.dumps(results, indent=1, default=float) + "\n")  # so far
    results["machine"]["load_at_end"] = _load()
    results["summary"] = summarize(results)
    out.write_text(json.dumps(results, indent=1, default=float) + "\n")
    print_tables(results["summary"])
    log(f"\nwrote {out}; load {results['machine']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
