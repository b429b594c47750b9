"""bench/preranking: two-tower vs FSCD pre-ranking vs the full ranking model.

    .venv/bin/python -m bench.preranking --dataset movielens --seeds 0 1 2 --out runs/bench_prerank
    .venv/bin/python -m bench.preranking --dataset synthetic --seeds 0 1 2 --out runs/bench_prerank

Per dataset and seed it trains, on the same split and statistics:

* ``rank``: the ranking model of the config's ``[model]`` (MovieLens: configs/movielens.toml,
  DCN-v2) on every field;
* ``two_tower``: the vector-product anchor (``ranking.two_tower``);
* ``fscd``: stage 1 once, then stage 2 + 3 for each budget (``--budgets``, e.g. ``fields:2``).

It reports the test AUC of each (mean ± std over seeds) and the share of the two-tower -> rank
AUC gap each FSCD budget closes; the recall of each pre-ranker against ranking (the share of the
ranking model's top 10 of 500 candidates that are in the pre-ranker's top 50, over
``--requests`` requests); FLOPs per candidate; and measured latency per candidate to score 1,000
candidates of one request (``RequestScorer``: request fields once, as a serving cascade does),
one request at a time (batch 1) and over 64 consecutive requests, as ratios against the
two-tower model timed in the same process. Results go to ``<out>/results.json``.

Candidate lists. MovieLens: the candidates are movies (movieId and its genres from movies.csv);
a request is a test user with its earliest test rating time; 500 candidates are the user's test
positives (ratings >= 4) plus movies sampled uniformly from the catalogue. Synthetic
(``features.synthetic``, 12 categorical and 4 numeric fields): the derived schema gives C1-C6
group ``user``, C7-C12 group ``item``, I1-I4 group ``context`` (costs 1.0 for categorical, 0.5
for numeric fields); a request is one test row's user and context fields, its candidates the item
fields of 500 random test rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import tensorflow as tf

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features import synthetic
from features.dataset import input_signature, iter_batches
from features.schema import load_schema
from pipelines.config import DataConfig, PipelineConfig, TrainConfig, load_config
from pipelines.preranking import (
    build_fscd,
    build_on_sample,
    build_run_two_tower,
    field_groups,
    finetune_stage,
    fit,
    select_stage,
)
from pipelines.train import (
    RunPaths,
    build_run_model,
    evaluate_model,
    make_scorer,
    prepare_data,
    prepare_stats,
)
from ranking.cascade import RequestScorer, model_inputs
from ranking.config import ModelConfig, PrerankConfig
from ranking.fscd import model_flops

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = 500
LATENCY_CANDIDATES = 1000


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_budget(text: str) -> tuple[str, float]:
    kind, _, value = text.partition(":")
    if kind not in ("fields", "flops", "latency") or not value:
        raise ValueError(f"budget {text!r}: expected fields:N, flops:N or latency:US")
    return kind, float(value)


# ---- datasets ----------------------------------------------------------------------------------


def movielens_config(out: Path, args: argparse.Namespace) -> PipelineConfig:
    cfg = load_config(ROOT / "configs" / "movielens.toml")
    pr = PrerankConfig(
        fscd_epochs=args.fscd_epochs,
        finetune_epochs=args.finetune_epochs,
        mlp=tuple(args.prerank_mlp),
        reg_weight=args.reg_weight,
        request_fields=args.request_fields,
    )
    train = dataclasses.replace(cfg.train, epochs=args.epochs, max_steps=args.max_steps)
    return dataclasses.replace(cfg, output_dir=str(out), train=train, preranking=pr)


def synthetic_config(out: Path, args: argparse.Namespace) -> PipelineConfig:
    data = out / "data"
    scfg = synthetic.SyntheticConfig(
        rows=args.rows,
        num_numeric=4,
        num_categorical=12,
        vocab_sizes=(50, 80, 100, 300, 500, 800, 1000, 700, 600, 5000, 20000, 2000),
        n_single=3,
        n_pairs=3,
        n_triples=1,
        n_numeric_effects=2,
        seed=0,
    )
    if not (data / "schema.toml").exists():
        synthetic.write_dataset(scfg, data)
    schema = load_schema(data / "schema.toml")
    for f in schema.model_inputs:
        if f.name.startswith("I"):
            schema = schema.replace_field(f.name, group="context", cost=0.5)
        else:
            group = "user" if int(f.name[1:]) <= 6 else "item"
            schema = schema.replace_field(f.name, group=group, cost=1.0)
    schema.save(data / "schema_grouped.toml")
    pr = PrerankConfig(
        fscd_epochs=args.fscd_epochs,
        finetune_epochs=args.finetune_epochs,
        mlp=tuple(args.prerank_mlp),
        reg_weight=args.reg_weight,
        request_fields=args.request_fields,
    )
    return PipelineConfig(
        output_dir=str(out),
        data=DataConfig(
            schema=str(data / "schema_grouped.toml"),
            train=(str(data / "train"),),
            test=(str(data / "test"),),
        ),
        model=ModelConfig(type="dcn_v2", embedding_dim=16, mlp=(128, 64), l2=1e-4),
        train=TrainConfig(batch_size=512, epochs=args.epochs, max_steps=args.max_steps),
        preranking=pr,
    )


def movielens_requests(schema: Any, test_files: list[Path], n: int, rng: np.random.Generator):
    """(request dicts, candidate dicts) for ``n`` test users, 500 candidates each."""
    movies = pacsv.read_csv(
        ROOT.parent / "shared" / "data" / "movielens-latest-small" / "movies.csv"
    ).to_pydict()
    genres = dict(zip((str(m) for m in movies["movieId"]), movies["genres"], strict=True))
    catalogue = np.array(sorted(genres))
    rows = next(iter_batches(schema, test_files, batch_size=10**9, shuffle=False))
    users = np.unique(rows["userId"])
    rng.shuffle(users)
    requests, candidates = [], []
    for u in users:
        mask = rows["userId"] == u
        positives = np.unique(rows["movieId"][mask & (rows["label"] > 0.5)])[: CANDIDATES // 5]
        if positives.size == 0:
            continue
        others = rng.choice(catalogue, CANDIDATES * 2, replace=False)
        others = others[~np.isin(others, positives)][: CANDIDATES - positives.size]
        ids = np.concatenate([positives.astype(str), others])
        requests.append(
            {"userId": np.array([u]), "rating_time": np.array([rows["rating_time"][mask].min()])}
        )
        candidates.append({"movieId": ids, "genres": np.array([genres.get(i, "") for i in ids])})
        if len(requests) == n:
            break
    return requests, candidates


def synthetic_requests(schema: Any, test_files: list[Path], n: int, rng: np.random.Generator):
    rows = next(iter_batches(schema, test_files, batch_size=200_000, shuffle=False))
    size = len(rows[schema.label.name])
    req_names = [f.name for f in schema.model_inputs if f.group in ("user", "context")]
    item_names = [f.name for f in schema.model_inputs if f.group == "item"]
    requests, candidates = [], []
    for i in rng.choice(size, n, replace=False):
        requests.append({k: rows[k][i : i + 1] for k in req_names})
        pick = rng.choice(size, CANDIDATES, replace=False)
        candidates.append({k: rows[k][pick] for k in item_names})
    return requests, candidates


def grow(cands: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """The candidate list repeated to ``size`` rows (the latency runs score 1,000)."""
    reps = -(-size // len(next(iter(cands.values()))))
    return {k: np.concatenate([v] * reps)[:size] for k, v in cands.items()}


# ---- measurements ------------------------------------------------------------------------------


def flat_scores(model: tf.keras.Model, schema: Any, request: dict, cands: dict) -> np.ndarray:
    n = len(next(iter(cands.values())))
    feats = {}
    sig = input_signature([f for f in schema.model_inputs if f.name in set(model_inputs(model))])
    for k, s in sig.items():
        v = np.repeat(request[k], n) if k in request else cands[k]
        feats[k] = tf.constant(v, dtype=s.dtype)
    return model.score(feats).numpy()


def recall_at(rank: np.ndarray, pre: np.ndarray, top_rank: int = 10, top_pre: int = 50) -> float:
    """Share of ranking's top ``top_rank`` inside the pre-ranker's top ``top_pre``."""
    best = set(np.argsort(-rank, kind="stable")[:top_rank].tolist())
    kept = set(np.argsort(-pre, kind="stable")[:top_pre].tolist())
    return len(best & kept) / top_rank


def request_fn(model: tf.keras.Model, schema: Any):
    """(tf.function of (request tensors, candidate tensors) -> logits, numpy -> tensors)."""
    scorer = RequestScorer(model, field_groups(schema), name=model.name)
    sig = input_signature([f for f in schema.model_inputs if f.name in set(model_inputs(model))])
    req_spec = {k: tf.TensorSpec([1], sig[k].dtype, k) for k in scorer.request_names}
    item_spec = {k: tf.TensorSpec([None], sig[k].dtype, k) for k in scorer.item_names}
    fn = tf.function(lambda r, c: scorer(r, c), input_signature=[req_spec, item_spec])

    def prepare(request: dict, cands: dict) -> tuple[dict, dict]:
        r = {k: tf.constant(request[k], sig[k].dtype) for k in scorer.request_names}
        c = {k: tf.constant(cands[k], sig[k].dtype) for k in scorer.item_names}
        return r, c

    return fn, prepare


def precomputed_two_tower_fn(model: tf.keras.Model, schema: Any):
    """Two-tower with the candidates' item vectors computed ahead: user tower + dot products."""
    scorer = RequestScorer(model, field_groups(schema), name="tt_pre")
    sig = input_signature(list(schema.model_inputs))
    req_spec = {k: tf.TensorSpec([1], sig[k].dtype, k) for k in scorer.request_names}

    @tf.function(input_signature=[req_spec, tf.TensorSpec([None, model.user_tower.dim])])
    def fn(r: dict, v: tf.Tensor) -> tf.Tensor:
        return model.score_candidates(model.user_vectors(r), v)

    def prepare(request: dict, cands: dict) -> tuple[dict, tf.Tensor]:
        r = {k: tf.constant(request[k], sig[k].dtype) for k in scorer.request_names}
        items = {k: tf.constant(cands[k], sig[k].dtype) for k in scorer.item_names}
        return r, model.item_vectors(items)  # ahead of the request, not timed

    return fn, prepare


def time_requests(
    calls: dict[str, Any], requests: list, cands: list, repeats: int
) -> dict[str, dict[str, float]]:
    """Microseconds per candidate of each ``(fn, prepare)``: one request (median of
    ``repeats``) and 64 different requests in a row (median of ``max(repeats // 10, 5)``
    rounds). Inputs are converted to tensors before timing; the models take turns in every
    round (in rotating order), so load from other processes hits them alike."""
    n = len(next(iter(cands[0].values())))
    ready = {
        label: [prepare(r, c) for r, c in zip(requests[:64], cands[:64], strict=True)]
        for label, (_, prepare) in calls.items()
    }
    labels = list(calls)
    for label in labels:
        calls[label][0](*ready[label][0]).numpy()
    one: dict[str, list[float]] = {label: [] for label in labels}
    many: dict[str, list[float]] = {label: [] for label in labels}
    for rep in range(repeats):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            fn, args = calls[label][0], ready[label][0]
            t0 = time.perf_counter()
            fn(*args).numpy()
            one[label].append(time.perf_counter() - t0)
    for rep in range(max(repeats // 10, 5)):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            fn = calls[label][0]
            t0 = time.perf_counter()
            for args in ready[label]:
                fn(*args).numpy()
            many[label].append(time.perf_counter() - t0)
    return {
        label: {
            "batch1_us_per_candidate": statistics.median(one[label]) / n * 1e6,
            "requests64_us_per_candidate": statistics.median(many[label])
            / (len(ready[label]) * n)
            * 1e6,
        }
        for label in labels
    }


def two_tower_flops(model: tf.keras.Model, candidates: int) -> dict[str, float]:
    """Per candidate: the dot product (+ user tower / candidates), and with the item tower."""

    def tower(t: Any) -> int:
        width = sum(t.embedding.dims) if t.embedding is not None else 0
        width += len(t.preprocessor.dense_fields)
        flops = 0
        for units in [*t.mlp_units, t.dim]:
            flops += 2 * width * units + units
            width = units
        return flops

    dot = 2 * model.user_tower.dim
    user = tower(model.user_tower) / candidates
    return {"precomputed": dot + user, "online": dot + user + tower(model.item_tower)}


def ranking_flops(model: tf.keras.Model, cfg: ModelConfig) -> int:
    width = sum(model.embedding.dims) + len(model.preprocessor.dense_fields)
    return model_flops(cfg.type, width, cfg.mlp, cfg.cross_layers, cfg.cross_rank)


# ---- one dataset -------------------------------------------------------------------------------


def run_dataset(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    cfg = movielens_config(work, args) if name == "movielens" else synthetic_config(work, args)
    paths = RunPaths(work)
    schema, train_files, test_files = prepare_data(cfg, paths, log)
    stats = prepare_stats(schema, train_files, paths, log)
    budgets = [parse_budget(b) for b in args.budgets]
    rng = np.random.default_rng(1234)
    make = movielens_requests if name == "movielens" else synthetic_requests
    requests, cands = make(schema, test_files, args.requests, rng)
    pcfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, mlp=tuple(args.prerank_mlp) or cfg.model.mlp)
    )
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        scfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
        tf.keras.utils.set_random_seed(seed)
        models: dict[str, tuple[tf.keras.Model, Any]] = {}
        rank = build_run_model(scfg, schema, stats)
        build_on_sample(rank, schema, train_files)
        fit(rank, schema, train_files, scfg, scfg.train.epochs, log, f"{name} s{seed} rank")
        models["rank"] = (rank, schema)
        tt = build_run_two_tower(cfg, schema, stats)
        build_on_sample(tt, schema, train_files)
        fit(tt, schema, train_files, scfg, scfg.train.epochs, log, f"{name} s{seed} two_tower")
        models["two_tower"] = (tt, schema)
        stage1 = build_fscd(scfg, schema, stats)
        build_on_sample(stage1, schema, train_files)
        pr = cfg.preranking
        fit(stage1, schema, train_files, scfg, pr.fscd_epochs, log, f"{name} s{seed} fscd-1")
        theta = dict(
            zip(
                stage1.selection.field_names,
                stage1.selection.keep_probability().numpy().tolist(),
                strict=True,
            )
        )
        selections = {}
        for kind, value in budgets:
            label = f"fscd[{kind}:{value:g}]"
            sel = select_stage(stage1, schema, scfg, train_files, kind, value)
            model, sub, _ = finetune_stage(
                scfg, schema, stats, train_files, stage1, sel["kept"], log
            )
            models[label] = (model, sub)
            selections[label] = {
                "kept": sel["kept"],
                "flops": sel["flops_per_candidate"]["kept"],
                "request_fields": sel["request_fields"]["fields"],
            }
        run: dict[str, Any] = {
            "seed": seed,
            "keep_prob": theta,
            "selections": selections,
            "models": {},
        }
        rank_scores = [
            flat_scores(rank, schema, r, c) for r, c in zip(requests, cands, strict=True)
        ]
        for label, (model, sub) in models.items():
            m = evaluate_model(make_scorer(model, sub), sub, test_files)
            entry = {"auc": m["auc"], "logloss": m["logloss"]}
            if label != "rank":
                pre = [
                    flat_scores(model, schema, r, c) for r, c in zip(requests, cands, strict=True)
                ]
                entry["recall_10_in_50"] = float(
                    np.mean([recall_at(a, b) for a, b in zip(rank_scores, pre, strict=True)])
                )
            run["models"][label] = entry
            log(f"{name} seed {seed} {label}: {entry}")
        if seed == args.seeds[0]:
            big = [grow(c, LATENCY_CANDIDATES) for c in cands]
            calls = {label: request_fn(model, schema) for label, (model, _) in models.items()}
            calls["two_tower(precomputed items)"] = precomputed_two_tower_fn(tt, schema)
            cost: dict[str, Any] = time_requests(calls, requests, big, args.repeats)
            cost["load_average"] = os.getloadavg()
            tt_flops = two_tower_flops(tt, LATENCY_CANDIDATES)
            for label, (model, _) in models.items():
                if label == "two_tower":
                    cost[label]["flops_per_candidate"] = tt_flops["online"]
                elif label == "rank":
                    cost[label]["flops_per_candidate"] = ranking_flops(model, cfg.model)
                else:
                    cost[label]["flops_per_candidate"] = ranking_flops(model, pcfg.model)
            cost["two_tower(precomputed items)"]["flops_per_candidate"] = tt_flops["precomputed"]
            base = cost["two_tower"]
            for entry in (v for k, v in cost.items() if k != "load_average"):
                for k in (
                    "batch1_us_per_candidate",
                    "requests64_us_per_candidate",
                    "flops_per_candidate",
                ):
                    entry[k.replace("_per_candidate", "_x_two_tower").replace("_us", "")] = (
                        entry[k] / base[k]
                    )
            run["cost"] = cost
            log(f"{name} cost: {json.dumps(cost, indent=1)}")
        runs.append(run)
    return {"dataset": name, "config": cfg.to_dict(), "runs": runs, "summary": summarize(runs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    labels = list(runs[0]["models"])
    out: dict[str, Any] = {}
    for label in labels:
        row = {}
        for key in ("auc", "recall_10_in_50"):
            vals = [r["models"][label][key] for r in runs if key in r["models"][label]]
            if vals:
                row[key] = {
                    "mean": statistics.fmean(vals),
                    "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                }
        out[label] = row
    gaps = [r["models"]["rank"]["auc"] - r["models"]["two_tower"]["auc"] for r in runs]
    for label in labels:
        if label.startswith("fscd"):
            closed = [
                (r["models"][label]["auc"] - r["models"]["two_tower"]["auc"]) / g
                if g
                else float("nan")
                for r, g in zip(runs, gaps, strict=True)
            ]
            out[label]["gap_closed"] = {
                "mean": statistics.fmean(closed),
                "std": statistics.stdev(closed) if len(closed) > 1 else 0.0,
            }
    return out


def markdown(results: dict[str, Any]) -> str:
    """The docs tables of one results.json: quality (mean ± std over seeds) and cost."""
    lines = []
    for name, res in results["datasets"].items():
        seeds = [r["seed"] for r in res["runs"]]
        lines += [
            f"### {name} (seeds {seeds})",
            "",
            "| model | kept fields (seed 0) | test AUC | gap closed | recall@10 in top 50 |",
            "|---|---|---|---|---|",
        ]
        sel = res["runs"][0]["selections"]
        for label, row in res["summary"].items():
            auc = row["auc"]
            gap = row.get("gap_closed")
            rec = row.get("recall_10_in_50")
            kept = ", ".join(sel[label]["kept"]) if label in sel else "all"
            lines.append(
                f"| {label} | {kept} | {auc['mean']:.4f} ± {auc['std']:.4f} | "
                + (f"{gap['mean']:.2f} ± {gap['std']:.2f}" if gap else "")
                + " | "
                + (f"{rec['mean']:.3f} ± {rec['std']:.3f}" if rec else "(reference)")
                + " |"
            )
        cost = res["runs"][0].get("cost")
        if cost:
            lines += [
                "",
                f"load average during the timing: {cost.get('load_average', 'not recorded')}",
                "",
                "| model | FLOPs / candidate | x two-tower | batch 1: us / candidate | x two-tower "
                "| 64 requests: us / candidate | x two-tower |",
                "|---|---|---|---|---|---|---|",
            ]
            for label, c in cost.items():
                if label == "load_average":
                    continue
                lines.append(
                    f"| {label} | {c['flops_per_candidate']:,.0f} | {c['flops_x_two_tower']:.2f} | "
                    f"{c['batch1_us_per_candidate']:.2f} | {c['batch1_x_two_tower']:.2f} | "
                    f"{c['requests64_us_per_candidate']:.2f} | {c['requests64_x_two_tower']:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.preranking", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dataset", choices=["movielens", "synthetic", "both"], default="both")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_preranking")
    p.add_argument("--budgets", nargs="+", default=["fields:2", "fields:3"])
    p.add_argument("--epochs", type=int, default=2, help="ranking and two-tower epochs")
    p.add_argument("--fscd-epochs", type=int, default=2)
    p.add_argument("--finetune-epochs", type=int, default=2)
    p.add_argument("--prerank-mlp", type=int, nargs="*", default=[])
    p.add_argument("--reg-weight", type=float, default=0.01)
    p.add_argument(
        "--request-fields",
        choices=["free", "budgeted"],
        default="free",
        help="FSCD's PrerankConfig.request_fields: free (request-side fields kept, only "
        "per-candidate cost budgeted) or budgeted (every field charged per candidate)",
    )
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows")
    p.add_argument("--requests", type=int, default=100, help="requests for recall (>= 64)")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--max-steps", type=int, default=0, help="cap training steps (smoke runs)")
    p.add_argument("--markdown", type=Path, help="print the tables of this results.json and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["movielens", "synthetic"] if args.dataset == "both" else [args.dataset]
    results = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_before": os.getloadavg(),
        "datasets": {},
    }
    for name in names:
        results["datasets"][name] = run_dataset(name, args, args.out)
        results["load_after_" + name] = os.getloadavg()
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    for name, res in results["datasets"].items():
        log(f"== {name}")
        for label, row in res["summary"].items():
            log(f"  {label}: {json.dumps(row)}")
    log(f"load average: {os.getloadavg()}; results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
