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
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.preranking.cost import measure_cost
from bench.preranking.datasets import (
    ROOT,
    SYNTHETIC_VOCABS,
    carve_validation,
    log,
    movielens_config,
    movielens_requests,
    synthetic_config,
    synthetic_requests,
)
from bench.preranking.report import markdown, summarize
from features.dataset import input_signature
from pipelines.config import PipelineConfig
from pipelines.preranking import (
    build_fscd,
    build_run_two_tower,
    finetune_stage,
    prerank_model_config,
    select_stage,
)
from pipelines.run.data import prepare_data, prepare_stats
from pipelines.run.model import build_on_sample, build_run_model
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.run.stage_fit import fit
from ranking.cascade import model_inputs


def parse_budget(text: str) -> tuple[str, float]:
    kind, _, value = text.partition(":")
    if kind not in ("fields", "flops", "latency") or not value:
        raise ValueError(f"budget {text!r}: expected fields:N, flops:N or latency:US")
    return kind, float(value)


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


def _finetune_options(args: argparse.Namespace, lr: float) -> list[tuple[str, float]]:
    """Stage 3's (init, learning rate) candidates. It starts from converged weights: its lr is
    chosen on the first seed from the ranking lr and a tenth of it (a fresh Adam at the full
    lr overshoots); ``--finetune-init scratch`` trains afresh on the kept fields at the ranking
    lr, ``best`` tries both."""
    options = [("stage1", lr), ("stage1", lr / 10)]
    if args.finetune_init in ("scratch", "best"):
        options = [("scratch", lr)] + (options if args.finetune_init == "best" else [])
    return options


def _finetuned(
    setting: tuple[PipelineConfig, Any, Any],
    files: tuple[list[Path], list[Path]],
    stage1: tf.keras.Model,
    kept: list[str],
    args: argparse.Namespace,
    options: list[tuple[str, float]],
) -> tuple[tf.keras.Model, Any, dict[str, Any]]:
    """Stage 3 fine-tuned with each of ``options`` (init, lr); the one best on validation:
    (model, its schema, its training summary with ``lr`` and ``init``)."""
    (scfg, schema, stats), (fit_files, valid_files) = setting, files
    best_ft = None
    for init, ft_lr in options:
        model, sub, summary = finetune_stage(
            scfg, schema, stats, fit_files, stage1, kept, log,
            init_from_stage1=init == "stage1",
            valid_files=valid_files, patience=args.patience, learning_rate=ft_lr,
        )  # fmt: skip
        auc = max([*summary["valid_auc"], summary.get("valid_auc_start", 0.0)])
        if best_ft is None or auc > best_ft[0]:
            best_ft = (auc, model, sub, {**summary, "lr": ft_lr, "init": init})
    if best_ft is None:
        raise ValueError("no fine-tuning option to try")
    return best_ft[1], best_ft[2], best_ft[3]


def _scored(
    models: dict[str, tuple[tf.keras.Model, Any]],
    schema: Any,
    requests: tuple[list, list],
    test_files: list[Path],
    label_prefix: str,
) -> dict[str, dict[str, float]]:
    """Each model's test AUC and log loss, and for the pre-rankers the recall@10-in-50 of the
    ranking model's top candidates over the sampled requests."""
    rank = models["rank"][0]
    rank_scores = [flat_scores(rank, schema, r, c) for r, c in zip(*requests, strict=True)]
    scored = {}
    for label, (model, sub) in models.items():
        m = evaluate_model(make_scorer(model, sub), sub, test_files)
        entry = {"auc": m["auc"], "logloss": m["logloss"]}
        if label != "rank":
            pre = [flat_scores(model, schema, r, c) for r, c in zip(*requests, strict=True)]
            entry["recall_10_in_50"] = float(
                np.mean([recall_at(a, b) for a, b in zip(rank_scores, pre, strict=True)])
            )
        scored[label] = entry
        log(f"{label_prefix} {label}: {entry}")
    return scored


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
            model, sub, training[label] = _finetuned(
                (scfg, schema, stats), (fit_files, valid_files), stage1, sel["kept"], args,
                [chosen[label]] if label in chosen else _finetune_options(args, lr),
            )  # fmt: skip
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
        }
        run["models"] = _scored(
            models, schema, (requests, cands), test_files, f"{name} seed {seed}"
        )
        if seed == args.seeds[0]:
            run["cost"] = measure_cost(models, tt, schema, cfg, pcfg, requests, cands, args)
            log(f"{name} cost: {json.dumps(run['cost'], indent=1)}")
        runs.append(run)
        (work / "runs_partial.json").write_text(json.dumps(runs, indent=1, default=str))
    return {"dataset": name, "config": cfg.to_dict(), "runs": runs, "summary": summarize(runs)}


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.preranking``."""
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
