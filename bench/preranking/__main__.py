"""bench/preranking: two-tower vs FSCD pre-ranking vs the full ranking model.

    .venv/bin/python -m bench.preranking --dataset movielens --seeds 0 1 2 --out runs/bench_prerank
    .venv/bin/python -m bench.preranking --dataset synthetic --seeds 0 1 2 --out runs/bench_prerank

Per dataset and seed it trains, on the same split and statistics:

* ``rank``: the ranking model of the config's ``[model]`` (MovieLens: configs/movielens.toml,
  DCN-v2) on every field;
* ``two_tower``: the vector-product anchor (``ranking.two_tower``);
* ``fscd``: stage 1 once, then stage 2 + 3 for each budget (``--budgets``, e.g. ``fields:2``).

Every model and FSCD stage trains the same way: at most ``--epochs`` epochs, stopped early on
validation rows carved once from the training rows (``--valid-fraction``, ``--patience``),
keeping its best epoch; ``rank`` and ``two_tower`` pick their learning rate from ``--lr-grid``
on the first seed (FSCD uses the ranking model's; stage 3 also tries a tenth of it, and with
``--finetune-init`` a fresh start).

It reports the test AUC of each (mean ± std over seeds), the gap rank - two-tower per seed with
its paired t statistic (measurable at t >= 3), and the share of that gap each FSCD budget
closes; the recall of each pre-ranker against ranking (the share of the
ranking model's top 10 of 500 candidates that are in the pre-ranker's top 50, over
``--requests`` requests); FLOPs per candidate; and measured latency per candidate to score 1,000
candidates of one request (``RequestScorer``: request fields once, as a serving cascade does),
one request at a time (batch 1) and over 64 consecutive requests, as ratios against the
two-tower model timed in the same process; ranking-architecture models also without the first
layer's request split (``X (no split)``). Results go to ``<out>/results.json``.

Candidate lists. MovieLens: the candidates are movies (movieId and its genres from movies.csv);
a request is a test user with its earliest test rating time; 500 candidates are the user's test
positives (ratings >= 4) plus movies sampled uniformly from the catalogue. Synthetic
(``features.synthetic``, 12 categorical and 4 numeric fields, vocabularies
``SYNTHETIC_VOCABS[--synthetic-vocab]``): the derived schema gives the categorical fields group
``user`` or ``item`` by ``synthetic_groups`` (``--synthetic-groups crossed``: every planted
cross is user x item; ``default``: C1-C6 user, C7-C12 item), I1-I4 group ``context`` (costs 1.0
for categorical, 0.5 for numeric fields); a request is one test row's user and context fields,
its candidates the item fields of 500 random test rows.
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
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import tensorflow as tf

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features import synthetic
from features.dataset import input_signature, iter_batches
from features.schema import load_schema
from features.synthetic_config import SyntheticConfig
from pipelines.config import DataConfig, PipelineConfig, TrainConfig, load_config
from pipelines.preranking import (
    build_fscd,
    build_run_two_tower,
    field_groups,
    finetune_stage,
    fit,
    prerank_model_config,
    select_stage,
)
from pipelines.run.data import prepare_data, prepare_stats
from pipelines.run.model import build_on_sample, build_run_model
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import evaluate_model, make_scorer
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
        model=args.prerank_model,
        reg_weight=args.reg_weight,
        request_fields=args.request_fields,
    )
    train = dataclasses.replace(cfg.train, epochs=args.epochs, max_steps=args.max_steps)
    return dataclasses.replace(cfg, output_dir=str(out), train=train, preranking=pr)


# The synthetic configs (features.synthetic; 12 categorical fields, 4 numeric, 3 planted single
# effects, 3 pure pairs, 1 pure triple, 2 numeric effects, seed 0). "bench": the vocabularies of
# the first tables; it plants singles C10, C11, C12, numeric I2, I3, pairs (C4, C5), (C6, C7),
# (C8, C9) and the triple (C1, C2, C3). "small_crosses": smaller vocabularies for the fields the
# crosses can land on (at most 200 values), so that a pure cross is learnable from 200k rows; it
# plants pairs (C4, C6), (C5, C9), (C7, C8) and the same triple and singles.
SYNTHETIC_VOCABS = {
    "bench": (50, 80, 100, 300, 500, 800, 1000, 700, 600, 5000, 20000, 2000),
    "small_crosses": (20, 30, 40, 60, 80, 100, 150, 200, 120, 5000, 20000, 2000),
}


def synthetic_groups(truth: dict[str, Any], rule: str) -> dict[str, str]:
    """``{categorical field: user | item}``. ``default``: C1-C6 user, C7-C12 item (on the
    "bench" vocabularies one user x item cross, (C6, C7)). ``crossed``: every planted cross
    straddles the request/candidate boundary (user x item crosses, as in ads), which a dot
    product of a user and an item vector holds only at low rank: a pair's first field is a
    user field, its second an item field; a triple's first two are user fields, its last an item
    field; the first planted single (by name) is a user field, the others item fields; the
    remaining fields alternate, user first."""
    names = [f"C{i}" for i in range(1, len(truth["vocab_sizes"]) + 1)]
    if rule == "default":
        return {n: "user" if i < len(names) // 2 else "item" for i, n in enumerate(names)}
    groups: dict[str, str] = {}
    for cross in [*truth["pairs"], *truth["triples"]]:
        fields = cross["fields"]
        groups.update({f: "user" for f in fields[:-1]})
        groups[fields[-1]] = "item"
    singles = sorted((s["field"] for s in truth["single"]), key=lambda n: int(n[1:]))
    groups.update({f: "user" if i == 0 else "item" for i, f in enumerate(singles)})
    rest = [n for n in names if n not in groups]
    groups.update({n: "user" if i % 2 == 0 else "item" for i, n in enumerate(rest)})
    return groups


def synthetic_config(out: Path, args: argparse.Namespace) -> PipelineConfig:
    data = out / "data"
    scfg = SyntheticConfig(
        rows=args.rows,
        num_numeric=4,
        num_categorical=12,
        vocab_sizes=SYNTHETIC_VOCABS[args.synthetic_vocab],
        n_single=3,
        n_pairs=3,
        n_triples=1,
        n_numeric_effects=2,
        seed=0,
    )
    if not (data / "schema.toml").exists():
        synthetic.write_dataset(scfg, data)
    truth = json.loads((data / "ground_truth.json").read_text())
    groups = synthetic_groups(truth, args.synthetic_groups)
    log(f"synthetic groups ({args.synthetic_groups}): {groups}")
    schema = load_schema(data / "schema.toml")
    for f in schema.model_inputs:
        if f.name.startswith("I"):
            schema = schema.replace_field(f.name, group="context", cost=0.5)
        else:
            schema = schema.replace_field(f.name, group=groups[f.name], cost=1.0)
    grouped = data / f"schema_grouped_{args.synthetic_groups}.toml"
    schema.save(grouped)
    pr = PrerankConfig(
        fscd_epochs=args.fscd_epochs,
        finetune_epochs=args.finetune_epochs,
        mlp=tuple(args.prerank_mlp),
        model=args.prerank_model,
        reg_weight=args.reg_weight,
        request_fields=args.request_fields,
    )
    return PipelineConfig(
        output_dir=str(out),
        data=DataConfig(
            schema=str(grouped),
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


def carve_validation(
    train_files: list[Path], out: Path, fraction: float, seed: int = 0
) -> tuple[list[Path], list[Path]]:
    """(fit files, validation files): ``fraction`` of the training rows, drawn once with a fixed
    seed, held out for early stopping (the same rows for every model and seed)."""
    fit_dir, valid_dir = out / "fit", out / "valid"
    if not (valid_dir / "part-00000.parquet").exists():
        table = pa.concat_tables([pq.read_table(f) for f in train_files])
        hold = np.random.default_rng(seed).random(table.num_rows) < fraction
        fit_dir.mkdir(parents=True, exist_ok=True)
        valid_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(pa.array(~hold)), fit_dir / "part-00000.parquet")
        pq.write_table(table.filter(pa.array(hold)), valid_dir / "part-00000.parquet")
    return [fit_dir / "part-00000.parquet"], [valid_dir / "part-00000.parquet"]


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


def request_fn(model: tf.keras.Model, schema: Any, split: bool = True):
    """(tf.function of (request tensors, candidate tensors) -> logits, numpy -> tensors);
    ``split``: the first layer's request part once per request (``RequestScorer``)."""
    scorer = RequestScorer(model, field_groups(schema), name=model.name, split_first_layer=split)
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


def ranking_flops(
    model: tf.keras.Model, cfg: ModelConfig, schema: Any, candidates: int = 1
) -> float:
    """FLOPs per candidate; with ``candidates`` > 1 the first layer's request columns are
    charged once per request of that many candidates (``RequestScorer``'s split)."""
    width = sum(model.embedding.dims) + len(model.preprocessor.dense_fields)
    groups = field_groups(schema)
    dims = dict(zip(model.embedding.field_names, model.embedding.dims, strict=True))
    dims.update({n: 1 for n in model.preprocessor.dense_fields})
    request = sum(w for n, w in dims.items() if groups.get(n) in ("user", "context"))
    residual = getattr(model, "residual", None)  # the towers, computed online as the base's
    extra = two_tower_flops(residual, candidates)["online"] if residual is not None else 0.0
    return extra + model_flops(
        cfg.type,
        width,
        cfg.mlp,
        cfg.cross_layers,
        cfg.cross_rank,
        request_width=request if candidates > 1 else 0,
        candidates_per_request=candidates,
    )


def train_early_stopped(
    build: Any,
    schema: Any,
    fit_files: list[Path],
    valid_files: list[Path],
    cfg: PipelineConfig,
    args: argparse.Namespace,
    stage: str,
    lrs: list[float],
) -> tuple[tf.keras.Model, dict[str, Any]]:
    """Builds and trains ``build()`` at each learning rate of ``lrs`` with early stopping on
    ``valid_files`` (at most ``args.epochs`` epochs, ``args.patience``); returns the model of
    the best validation AUC and its summary (``lr``, and every tried lr's best AUC)."""
    best: tuple[float, tf.keras.Model, dict[str, Any]] | None = None
    tried = {}
    for lr in lrs:
        model = build()
        build_on_sample(model, schema, fit_files)
        summary = fit(
            model,
            schema,
            fit_files,
            cfg,
            args.epochs,
            log,
            f"{stage} lr {lr:g}",
            valid_files=valid_files,
            patience=args.patience,
            learning_rate=lr,
        )
        auc = max(summary["valid_auc"])
        tried[f"{lr:g}"] = auc
        if best is None or auc > best[0]:
            best = (auc, model, {**summary, "lr": lr})
    assert best is not None
    return best[1], {**best[2], "lr_tried": tried}


# ---- one dataset -------------------------------------------------------------------------------


def run_dataset(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    cfg = movielens_config(work, args) if name == "movielens" else synthetic_config(work, args)
    paths = RunPaths(work)
    schema, train_files, _, test_files = prepare_data(cfg, paths, log)
    stats = prepare_stats(schema, train_files, paths, log)
    fit_files, valid_files = carve_validation(train_files, work / "split", args.valid_fraction)
    budgets = [parse_budget(b) for b in args.budgets]
    rng = np.random.default_rng(1234)
    make = movielens_requests if name == "movielens" else synthetic_requests
    requests, cands = make(schema, test_files, args.requests, rng)
    pcfg = prerank_model_config(cfg)
    lr_grid = list(args.lr_grid or [cfg.train.learning_rate])
    chosen: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        pr = dataclasses.replace(
            cfg.preranking, finetune_epochs=args.epochs, tower_residual=args.tower_residual
        )
        scfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, seed=seed), preranking=pr
        )
        tf.keras.utils.set_random_seed(seed)
        models: dict[str, tuple[tf.keras.Model, Any]] = {}
        training: dict[str, Any] = {}

        def lrs(family: str) -> list[float]:
            return [chosen[family]] if family in chosen else lr_grid

        rank, training["rank"] = train_early_stopped(
            lambda scfg=scfg: build_run_model(scfg, schema, stats),
            schema, fit_files, valid_files, scfg, args, f"{name} s{seed} rank", lrs("rank"),
        )  # fmt: skip
        chosen["rank"] = training["rank"]["lr"]
        models["rank"] = (rank, schema)
        tt, training["two_tower"] = train_early_stopped(
            lambda: build_run_two_tower(cfg, schema, stats),
            schema, fit_files, valid_files, scfg, args, f"{name} s{seed} two_tower",
            lrs("two_tower"),
        )  # fmt: skip
        chosen["two_tower"] = training["two_tower"]["lr"]
        models["two_tower"] = (tt, schema)
        # FSCD inherits the ranking architecture, so it trains at the ranking model's lr
        lr = chosen["rank"]
        stage1 = build_fscd(scfg, schema, stats)
        build_on_sample(stage1, schema, fit_files)
        training["fscd-1"] = fit(
            stage1, schema, fit_files, scfg, args.epochs, log, f"{name} s{seed} fscd-1",
            valid_files=valid_files, patience=args.patience, learning_rate=lr,
        )  # fmt: skip
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
            sel = select_stage(stage1, schema, scfg, fit_files, kind, value)
            # stage 3 starts from converged weights: its lr is chosen on the first seed from
            # the ranking lr and a tenth of it (a fresh Adam at the full lr overshoots)
            # (--finetune-init best: or trained afresh on the kept fields at the ranking lr)
            options = [("stage1", lr), ("stage1", lr / 10)]
            if args.finetune_init in ("scratch", "best"):
                options = [("scratch", lr)] + (options if args.finetune_init == "best" else [])
            if label in chosen:
                options = [chosen[label]]
            best_ft = None
            for init, ft_lr in options:
                model, sub, summary = finetune_stage(
                    scfg, schema, stats, fit_files, stage1, sel["kept"], log,
                    init_from_stage1=init == "stage1",
                    valid_files=valid_files, patience=args.patience, learning_rate=ft_lr,
                )  # fmt: skip
                auc = max([*summary["valid_auc"], summary.get("valid_auc_start", 0.0)])
                if best_ft is None or auc > best_ft[0]:
                    best_ft = (auc, model, sub, {**summary, "lr": ft_lr, "init": init})
            assert best_ft is not None
            _, model, sub, training[label] = best_ft
            chosen[label] = (training[label]["init"], training[label]["lr"])
            models[label] = (model, sub)
            selections[label] = {
                "kept": sel["kept"],
                "flops": sel["flops_per_candidate"]["kept"],
                "request_fields": sel["request_fields"]["fields"],
            }
        run: dict[str, Any] = {
            "seed": seed,
            "keep_prob": theta,
            "reg_weight": float(stage1.selection.reg_weight),
            "selections": selections,
            "training": {
                k: {
                    key: v.get(key) for key in ("best_epoch", "valid_auc", "lr", "lr_tried", "init")
                }
                for k, v in training.items()
            },
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
            run["cost"] = measure_cost(models, tt, schema, cfg, pcfg, requests, cands, args)
            log(f"{name} cost: {json.dumps(run['cost'], indent=1)}")
        runs.append(run)
        (work / "runs_partial.json").write_text(json.dumps(runs, indent=1, default=str))
    return {"dataset": name, "config": cfg.to_dict(), "runs": runs, "summary": summarize(runs)}


NO_SPLIT = " (no split)"


def measure_cost(
    models: dict[str, tuple[tf.keras.Model, Any]],
    tt: tf.keras.Model,
    schema: Any,
    cfg: PipelineConfig,
    pcfg: PipelineConfig,
    requests: list,
    cands: list,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """FLOPs and latency per candidate (1,000 candidates a request) of every model, in one
    process with the models taking turns; ranking-architecture models twice: with the first
    layer's request part once per request (the label) and without (``" (no split)"``)."""
    big = [grow(c, LATENCY_CANDIDATES) for c in cands]
    calls = {}
    for label, (model, _) in models.items():
        calls[label] = request_fn(model, schema)
        if label != "two_tower":
            calls[label + NO_SPLIT] = request_fn(model, schema, split=False)
    calls["two_tower(precomputed items)"] = precomputed_two_tower_fn(tt, schema)
    load_before = os.getloadavg()
    cost: dict[str, Any] = time_requests(calls, requests, big, args.repeats)
    cost["load_average"] = [load_before, os.getloadavg()]
    tt_flops = two_tower_flops(tt, LATENCY_CANDIDATES)
    for label, (model, _) in models.items():
        if label == "two_tower":
            cost[label]["flops_per_candidate"] = tt_flops["online"]
            continue
        mcfg = cfg.model if label == "rank" else pcfg.model
        cost[label]["flops_per_candidate"] = ranking_flops(model, mcfg, schema, LATENCY_CANDIDATES)
        cost[label + NO_SPLIT]["flops_per_candidate"] = ranking_flops(model, mcfg, schema)
    cost["two_tower(precomputed items)"]["flops_per_candidate"] = tt_flops["precomputed"]
    base = cost["two_tower"]
    for entry in (v for k, v in cost.items() if k != "load_average"):
        for k in ("batch1_us_per_candidate", "requests64_us_per_candidate", "flops_per_candidate"):
            entry[k.replace("_per_candidate", "_x_two_tower").replace("_us", "")] = (
                entry[k] / base[k]
            )
    return cost


def mean_std(vals: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "n": len(vals),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model: AUC and recall (mean ± std over seeds); for FSCD the share of the gap closed
    per seed and as a ratio of means; ``gap``: rank - two-tower per seed, its paired t statistic
    (mean / (std / sqrt(n))) and whether it is measurable (t >= 3, n >= 3: the gap is clearly
    outside the seed noise; otherwise "gap closed" is not reported as a result)."""
    labels = list(runs[0]["models"])
    out: dict[str, Any] = {}
    for label in labels:
        row = {}
        for key in ("auc", "recall_10_in_50"):
            vals = [r["models"][label][key] for r in runs if key in r["models"][label]]
            if vals:
                row[key] = mean_std(vals)
        out[label] = row
    gaps = [r["models"]["rank"]["auc"] - r["models"]["two_tower"]["auc"] for r in runs]
    gap = mean_std(gaps)
    sem = gap["std"] / len(gaps) ** 0.5 if len(gaps) > 1 else 0.0
    gap["t"] = gap["mean"] / sem if sem > 0 else float("nan")
    gap["measurable"] = bool(len(gaps) >= 3 and gap["mean"] > 0 and gap["t"] >= 3.0)
    gap["per_seed"] = gaps
    out["gap"] = gap
    tt_mean, rank_mean = out["two_tower"]["auc"]["mean"], out["rank"]["auc"]["mean"]
    for label in labels:
        if label.startswith("fscd"):
            closed = [
                (r["models"][label]["auc"] - r["models"]["two_tower"]["auc"]) / g
                if g
                else float("nan")
                for r, g in zip(runs, gaps, strict=True)
            ]
            out[label]["gap_closed"] = {**mean_std(closed), "per_seed": closed}
            out[label]["gap_closed_of_means"] = (out[label]["auc"]["mean"] - tt_mean) / (
                rank_mean - tt_mean
            )
    return out


def markdown(results: dict[str, Any]) -> str:
    """The docs tables of one results.json: quality (mean ± std over seeds), the gap, epochs
    and learning rates chosen, and cost."""
    lines = []
    for name, res in results["datasets"].items():
        seeds = [r["seed"] for r in res["runs"]]
        summary = res["summary"]
        gap = summary.get("gap")
        lines += [
            f"### {name} (seeds {seeds})",
            "",
            f"| model | kept fields (seed {seeds[0]}) | test AUC | gap closed per seed | of means | "
            "recall@10 in top 50 | best epochs (lr) |",
            "|---|---|---|---|---|---|---|",
        ]
        sel = res["runs"][0]["selections"]
        for label, row in summary.items():
            if label == "gap":
                continue
            auc = row["auc"]
            closed = row.get("gap_closed")
            rec = row.get("recall_10_in_50")
            kept = ", ".join(sel[label]["kept"]) if label in sel else "all"
            train = [r.get("training", {}).get(label, {}) for r in res["runs"]]
            epochs = "/".join(str(t.get("best_epoch", "?")) for t in train)
            lr = train[0].get("lr")
            init = train[0].get("init")
            lines.append(
                f"| {label} | {kept} | {auc['mean']:.4f} ± {auc['std']:.4f} | "
                + (f"{closed['mean']:.2f} ± {closed['std']:.2f}" if closed else "")
                + " | "
                + (f"{row['gap_closed_of_means']:.2f}" if closed else "")
                + " | "
                + (f"{rec['mean']:.3f} ± {rec['std']:.3f}" if rec else "(reference)")
                + f" | {epochs}"
                + (f" ({lr:g}{', ' + init if init else ''})" if lr else "")
                + " |"
            )
        if gap:
            lines += [
                "",
                f"Gap rank - two-tower: {gap['mean']:.4f} ± {gap['std']:.4f} over {gap['n']} "
                f"seeds (per seed {', '.join(f'{g:.4f}' for g in gap['per_seed'])}; paired t = "
                f"{gap['t']:.1f}): "
                + (
                    "measurable."
                    if gap["measurable"]
                    else "NOT measurable ("
                    + ("fewer than 3 seeds)." if gap["n"] < 3 else "inside the seed noise).")
                ),
            ]
        fscd1 = [r.get("training", {}).get("fscd-1", {}) for r in res["runs"]]
        if any(fscd1):
            lines.append(
                f"FSCD stage 1 best epochs {'/'.join(str(t.get('best_epoch')) for t in fscd1)}; "
                f"penalty weight {res['runs'][0].get('reg_weight', 0):.3g}; keep probabilities "
                f"(seed {seeds[0]}): "
                + ", ".join(f"{k} {v:.2f}" for k, v in res["runs"][0]["keep_prob"].items())
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
    p.add_argument(
        "--epochs",
        type=int,
        default=12,
        help="the most epochs of every model and FSCD stage; each stops early on the "
        "validation rows (--valid-fraction, --patience) and keeps its best epoch",
    )
    p.add_argument("--valid-fraction", type=float, default=0.1, help="training rows held out")
    p.add_argument("--patience", type=int, default=2, help="epochs without a better val AUC")
    p.add_argument(
        "--lr-grid",
        type=float,
        nargs="*",
        default=[],
        help="learning rates tried on the first seed for rank and two_tower each (best "
        "validation AUC is kept for the other seeds; FSCD uses rank's); default: the config's",
    )
    p.add_argument("--fscd-epochs", type=int, default=2, help="(unused: early stopping)")
    p.add_argument("--finetune-epochs", type=int, default=2, help="(unused: early stopping)")
    p.add_argument(
        "--finetune-init",
        choices=["stage1", "scratch", "best"],
        default="stage1",
        help="FSCD stage 3 starts from the stage-1 weights (the paper; lr and a tenth of it "
        "tried), afresh (at the ranking lr), or whichever of those is best on validation "
        "(chosen on the first seed)",
    )
    p.add_argument("--prerank-mlp", type=int, nargs="*", default=[])
    p.add_argument(
        "--prerank-model",
        choices=["", "dnn", "dcn_v2"],
        default="",
        help="the pre-ranking model's type ([preranking] model; default: the ranking model's)",
    )
    p.add_argument(
        "--tower-residual",
        action="store_true",
        help="FSCD's models add a jointly trained two-tower term ([preranking] tower_residual)",
    )
    p.add_argument(
        "--reg-weight", type=float, default=None, help="FSCD penalty weight (default 1/N)"
    )
    p.add_argument(
        "--synthetic-groups",
        choices=["crossed", "default"],
        default="crossed",
        help="which synthetic fields are user / item (see synthetic_groups)",
    )
    p.add_argument(
        "--synthetic-vocab",
        choices=sorted(SYNTHETIC_VOCABS),
        default="bench",
        help="vocabulary sizes of the synthetic config (see SYNTHETIC_VOCABS)",
    )
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
