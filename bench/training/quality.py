"""Test AUC of StitchRec's training recipes against tuned baselines, with paired intervals.

For every dataset, the first run converts the data (train / validation / test shards); every
other run reads those shards, so every method and seed sees the same rows. Baselines, chosen
on the validation rows only and scored once on the test rows:

- ``sk_lr``: scikit-learn ``LogisticRegression`` (lbfgs) on one-hot features (the trained
  model's preprocessor: one column per id, standardized numeric columns), ``C`` over a grid;
- ``xgboost``: ``XGBClassifier`` (hist) on the same features, depth x trees over a small grid.

StitchRec recipes (``--methods``): a config of ``[data]`` and ``[model] type`` only, every
other key at its default (docs/training.md#defaults: batch 256, at most 20 epochs ended by early
stopping on the validation split; ``lr``: ``optimizer = "auto"``), and ``--epochs`` when given:

- ``lr``: ``type = "lr"`` (the exact fit up to 250,000 training rows, else FTRL at most 60
  epochs); ``lr_ftrl``: the same with ``optimizer = "ftrl"`` (FTRL's defaults);
  ``lr_lbfgs``: with ``optimizer = "lbfgs"`` (its default ``lbfgs_c`` path);
- ``dcn``: ``type = "dcn_v2"`` (with the defaults' weight average and learning rate 3e-3);
- ``dcn_plain``: the same with ``weight_average = "none"`` (and so Adam's 1e-3);
- ``fm``, ``dnn``, ``fm_plain``, ``dnn_plain``: the same for those model types;
- ``dcn_wide``, ``dnn_wide``: ``dcn`` / ``dnn`` with ``wide = true`` (the wide term of ``lr``
  added to the logit);
- ``dcn_autolrs``: the same with ``lr_schedule = "autolrs"`` (its defaults);
- ``dcn_ensemble``: the same with ``ensemble = "auto"`` (one cyclic cycle per epoch); its row
  ``dcn_ensemble_best`` is the single best checkpoint of the same run; ``dcn x seeds`` is the
  mean logit of the ``dcn`` runs of every seed, an ensemble of independent runs (its steps and
  seconds are their sum).

A run folder of ``--work`` that holds a finished run is read back, not trained again, and so
are the baselines (``baselines.npz`` beside the runs) when the shards and grids are the same.

Each StitchRec row is over ``--seeds`` seeds (mean ± standard deviation of test AUC); the
paired bootstrap (``pipelines.evaluation.compare.compare_scores``, the engine of ``stitchrec
ab``, 1,000 resamples of the test rows) compares every seed's test scores with ``sk_lr``'s, and
the row prints the mean difference and how many seeds' 95% intervals exclude 0 on either side,
and the interval of the mean over the seeds (``paired_over_seeds``: every seed against
``sk_lr`` on the same resamples).
``--continue-over-validation`` adds a second table per dataset: every run continued for one
epoch over its validation rows, against scikit-learn's LR refit on the training and validation
rows (``bench.training.continued``). ``--ensemble-cycles-per-epoch K`` and
``--ensemble-learning-rate LR`` change the ``dcn_ensemble`` recipe's cycles (K per epoch, each
from LR down to 0; docs/ensembles.md). ``--latency`` also times the exported ensemble's ``serving_default`` against the single
model's (median of 50 calls on 512 test rows, same process).

Datasets (``--datasets``): ``movielens`` (random 80/20 split), ``movielens_time`` (the last 20%
of ratings by timestamp as test; ``--recent-validation F``: the most recent fraction F of the
training period is the validation split instead of a random tenth), ``open_bandit`` (20,000 impressions, about 100 clicks;
its AUCs are noisy), ``synthetic`` (``--rows`` rows, Criteo layout).

    python -m bench.training.quality --data-root ../shared/data --seeds 3
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from bench.training.continued import continued
from bench.training.lr_baseline import REPO, bench_parser, converted, dataset_configs, encode
from features.dataset import field_tf_dtype, iter_batches, list_parquet
from features.schema import load_schema
from pipelines.config import config_from_dict
from pipelines.config_train import TrainConfig
from pipelines.evaluation import bootstrap
from pipelines.evaluation.compare import compare_scores
from pipelines.export import export_ensemble, export_run, load_checkpoint_model
from pipelines.run.model import load_trained_model
from pipelines.run.scoring import predict
from pipelines.train import train

C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
XGB_GRID = [(depth, trees) for depth in (3, 6) for trees in (100, 300)]
METHODS = ("lr", "dcn", "dcn_plain", "dcn_autolrs", "dcn_ensemble")
#: ``--methods`` names of the other model types: their defaults, and ``_plain`` as for dcn
_TYPES = {"dcn": "dcn_v2", "fm": "fm", "dnn": "dnn"}


def method_config(
    method: str,
    data: dict,
    out: Path,
    seed: int,
    epochs: int,
    cycles_per_epoch: int = 1,
    ensemble_lr: float = 0.0,
) -> Any:
    """The config of one recipe's run. ``dcn_ensemble``: ``cycles_per_epoch`` > 1 sets the
    cyclic schedule's ``cycle_steps`` to that fraction of an epoch of ``data["train"]``, and
    ``ensemble_lr`` (> 0) the top of every cycle; else the config defaults."""
    base = method.split("_")[0]
    model: dict[str, Any] = {"type": _TYPES.get(base, "lr")}
    tc: dict[str, Any] = {"seed": seed, "log_every": 10**6}
    if epochs:
        tc["epochs"] = epochs
    if method == "dcn_autolrs":
        tc["lr_schedule"] = "autolrs"
    if method == "dcn_ensemble":
        tc["ensemble"] = "auto"
        if ensemble_lr > 0:
            tc["learning_rate"] = ensemble_lr
        if cycles_per_epoch > 1:
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in list_parquet(data["train"]))
            epoch = math.ceil(rows / TrainConfig.batch_size)
            tc["lr_schedule"] = "cyclic"
            tc["lr_schedule_options"] = {"cycle_steps": max(2, epoch // cycles_per_epoch)}
    if method.endswith("_plain"):  # no weight average, so Adam's rate 1e-3
        tc["weight_average"] = "none"
    if method.endswith("_wide"):
        model["wide"] = True
    if method in ("lr_lbfgs", "lr_ftrl"):  # lbfgs: the exact fit along the C path
        tc["optimizer"] = method.removeprefix("lr_")
    return config_from_dict(
        {"output_dir": str(out), "data": data, "model": model, "train": tc}, base_dir=REPO
    )


def time_split(
    data_root: Path, work: Path, recent_validation: float = 0.0
) -> dict[str, Any] | None:
    """MovieLens ratings split by time: the last 20% by timestamp is the test file.

    ``recent_validation`` > 0: that fraction of the training period's ratings, the most recent
    ones, is the validation split (``[data] validation_split = "recent"``); 0: the run's
    default validation split, a random tenth of the training ratings."""
    ratings = data_root / "movielens-latest-small" / "ratings.csv"
    if not ratings.exists():
        print(f"movielens_time: skipped, {ratings} does not exist")
        return None
    with ratings.open() as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = sorted(reader, key=lambda r: int(r[3]))
    cut = int(len(rows) * 0.8)
    out = work / "movielens_time"
    out.mkdir(parents=True, exist_ok=True)
    side = out / "movies.csv"  # the schema joins movies.csv from beside the ratings file
    if not side.exists():  # a link left dangling by an earlier call is replaced
        side.unlink(missing_ok=True)
        side.symlink_to((ratings.parent / "movies.csv").resolve())
    for name, part in (("train.csv", rows[:cut]), ("test.csv", rows[cut:])):
        with (out / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(part)
    data: dict[str, Any] = {
        "schema": "movielens",
        "train": [str(out / "train.csv")],
        "test": [str(out / "test.csv")],
    }
    if recent_validation:
        data |= {"validation_split": "recent", "validation_fraction": recent_validation}
    return data


def test_scores(run_dir: Path, files: list[str], members: list[str] | None = None) -> np.ndarray:
    """Click probabilities of the run's selected checkpoint (or the mean logit of
    ``members``) on every row of ``files``, in file order."""
    if members:
        models = [load_checkpoint_model(run_dir, m) for m in members]
    else:
        models = [load_trained_model(run_dir)[0]]
    schema = load_schema(run_dir / "schema.toml")

    def scorer(features: dict) -> tf.Tensor:
        return tf.sigmoid(tf.reduce_mean([m(features, training=False) for m in models], axis=0))

    return predict(scorer, schema, list_parquet(files))[1]


def baselines(run_dir: Path, data: dict[str, Any], xgb: bool = True) -> dict[str, Any]:
    """``sk_lr`` and (``xgb``) ``xgboost``, chosen on validation, with their test
    probabilities."""
    import xgboost

    model, schema, _ = load_trained_model(run_dir)
    x_tr, y_tr = encode(model, schema, data["train"])
    x_va, y_va = encode(model, schema, data["validation"])
    x_te, y_te = encode(model, schema, data["test"])
    out = {"labels": y_te}
    best = None
    for c in C_GRID:
        m = LogisticRegression(C=c, max_iter=2000).fit(x_tr, y_tr)
        v = roc_auc_score(y_va, m.decision_function(x_va))
        if best is None or v > best[0]:
            best = (v, f"C={c}", m.predict_proba(x_te)[:, 1])
    out["sk_lr"] = best
    if not xgb:
        return out
    best = None
    for depth, trees in XGB_GRID:
        m = xgboost.XGBClassifier(
            n_estimators=trees, max_depth=depth, learning_rate=0.1, tree_method="hist", n_jobs=2
        ).fit(x_tr, y_tr)
        v = roc_auc_score(y_va, m.predict_proba(x_va)[:, 1])
        if best is None or v > best[0]:
            best = (v, f"depth={depth} trees={trees}", m.predict_proba(x_te)[:, 1])
    out["xgboost"] = best
    return out


def baselines_key(data: dict[str, Any], xgb: bool) -> str:
    """What ``baselines`` depends on: the grids and the bytes of every shard it reads."""
    files = {
        part: [
            [Path(f).name, hashlib.sha256(Path(f).read_bytes()).hexdigest()]
            for f in list_parquet(data[part])
        ]
        for part in ("train", "validation", "test")
    }
    grids = {"c": list(C_GRID), "xgboost": [list(g) for g in XGB_GRID] if xgb else None}
    return json.dumps({"files": files, "grids": grids}, sort_keys=True)


def cached_baselines(path: Path, run_dir: Path, data: dict[str, Any], xgb: bool) -> dict[str, Any]:
    """``baselines``, read back from ``path`` when it was written for the same shards and grids
    (``baselines_key``), else computed and written there (atomically): at 2,000,000 rows the
    scikit-learn C grid alone takes about half an hour on two cores."""
    key = baselines_key(data, xgb)
    if path.exists():
        with np.load(path) as f:
            if str(f["key"]) == key:
                out: dict[str, Any] = {"labels": f["labels"]}
                for name in [n for n in ("sk_lr", "xgboost") if f"{n}_scores" in f]:
                    how = str(f[f"{name}_how"])
                    out[name] = (float(f[f"{name}_validation"]), how, f[f"{name}_scores"])
                return out
    out = baselines(run_dir, data, xgb=xgb)
    arrays: dict[str, Any] = {"key": np.array(key), "labels": out["labels"]}
    for name in [n for n in ("sk_lr", "xgboost") if n in out]:
        v, how, scores = out[name]
        arrays |= {f"{name}_validation": v, f"{name}_how": np.array(how), f"{name}_scores": scores}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return out


def paired(labels: np.ndarray, control: np.ndarray, treatment: np.ndarray) -> dict[str, Any]:
    """The paired bootstrap of test AUC, treatment - control."""
    r = compare_scores(labels, control, treatment, ks=(), resamples=1000, seed=0, workers=2)
    return r["overall"]["metrics"]["auc"]


def paired_over_seeds(
    labels: np.ndarray, controls: list[np.ndarray], treatments: list[np.ndarray]
) -> dict[str, Any]:
    """The paired bootstrap of the mean over seeds of test AUC, treatment - control: seed i's
    treatment against seed i's control, every seed on the same resamples of the test rows (1,000,
    as ``paired``). The interval is over the test rows with these seeds' runs fixed: it says
    whether these runs are better on average on the rows' population, not how another seed's
    run would do (the spread of the seeds' own deltas says that)."""
    kernels = {}
    for i, (c, t) in enumerate(zip(controls, treatments, strict=True)):
        kernels[("control", i)] = bootstrap.AUCKernel(labels, c)
        kernels[("treatment", i)] = bootstrap.AUCKernel(labels, t)
    boot = bootstrap.run(kernels, bootstrap.Resampler(labels.size, 1000, seed=0), workers=2)
    mean = {
        arm: np.mean([boot[(arm, i)] for i in range(len(controls))], axis=0)
        for arm in ("control", "treatment")
    }
    point = {
        arm: statistics.fmean(roc_auc_score(labels, s) for s in scores)
        for arm, scores in (("control", controls), ("treatment", treatments))
    }
    d = bootstrap.difference(
        "auc", point["control"], point["treatment"], mean["control"], mean["treatment"]
    )
    return d.to_dict()


def latency(single: Path, ensemble: Path, data: dict[str, Any]) -> dict[str, float]:
    """Median milliseconds of 50 calls of each SavedModel on 512 test rows."""
    schema = load_schema(single / "assets.extra" / "schema.toml")
    files = list_parquet(data["test"])
    batch = next(iter_batches(schema, files, batch_size=512, shuffle=False))
    feats = {}
    for f in schema.model_inputs:
        feats[f.name] = tf.constant(batch[f.name], field_tf_dtype(f))
    out = {}
    for name, path in (("single", single), ("ensemble", ensemble)):
        sig = tf.saved_model.load(str(path)).signatures["serving_default"]
        sig(**feats)
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            sig(**feats)
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(times)
    out["ratio"] = out["ensemble"] / out["single"]
    return out


def run_row(out: Path, report: dict, seed: int, test_files: list[str]) -> dict[str, Any]:
    """One run's row of a table: its steps, seconds, test AUC and test scores."""
    return {
        "seed": seed,
        "steps": report["steps"],
        "seconds": report["train_seconds"] + report["eval_seconds"],
        "test_auc": report["test"]["auc"],
        "scores": test_scores(out, test_files),
        "dir": out,
    }


def run_method(method: str, data: dict, work: Path, seed: int, args: Any) -> dict[str, Any]:
    out = work / f"{method}_seed{seed}"
    if (out / "train_report.json").exists():  # finished by an earlier call: read back
        report = json.loads((out / "train_report.json").read_text())
    else:
        cfg = method_config(
            method,
            data,
            out,
            seed,
            args.epochs,
            args.ensemble_cycles_per_epoch,
            args.ensemble_learning_rate,
        )
        report = train(cfg, lambda _line: None)
    test_files = converted(out, data)["test"]  # the run's own test shards when it converted
    row = run_row(out, report, seed, test_files)
    ens = report.get("ensemble")
    if ens:
        row["ensemble"] = {
            "test_auc": ens["test"]["auc"],
            "members": len(ens["checkpoints"]),
            "snapshots": len(ens["collection"]["snapshots"]),
            "scores": test_scores(out, test_files, ens["checkpoints"]),
            "checkpoints": ens["checkpoints"],
        }
    return row


def independent_ensemble(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean logit of independently trained runs (one row: steps and seconds summed)."""
    p = np.clip(np.stack([r["scores"] for r in runs]), 1e-7, 1 - 1e-7)
    scores = 1.0 / (1.0 + np.exp(-np.mean(np.log(p / (1 - p)), axis=0)))
    return {
        "seed": -1,
        "steps": sum(r["steps"] for r in runs),
        "seconds": sum(r["seconds"] for r in runs),
        "test_auc": None,
        "scores": scores,
        "dir": None,
    }


def bench_dataset(name: str, args: Any, work: Path) -> dict[str, Any] | None:
    if name == "movielens_time":
        data = time_split(Path(args.data_root), work, args.recent_validation)
    else:
        data = dataset_configs(name, Path(args.data_root), work, args.rows)
    if data is None:
        return None
    first = work / "lr_seed0"
    rows: dict[str, list[dict[str, Any]]] = {}
    rows["lr"] = [run_method("lr", data, work, 0, args)]
    shards = converted(first, data)
    base = cached_baselines(work / "baselines.npz", first, shards, not args.no_xgboost)
    for method in args.methods:
        for seed in range(args.seeds):
            if method == "lr" and seed == 0:
                continue
            rows.setdefault(method, []).append(run_method(method, shards, work, seed, args))
            print(f"  {name} {method} seed {seed}: {rows[method][-1]['test_auc']:.4f}", flush=True)
    result = {"name": name, "baselines": base, "rows": rows, "latency": None}
    if args.continue_over_validation:
        result["continued"] = continued(result, shards, work, run_row, C_GRID)
    ens_rows = rows.get("dcn_ensemble")
    singles = rows.get("dcn", [])
    if len(singles) > 1:  # the seeds' runs as one ensemble: the same cost as len(singles) runs
        rows["dcn x seeds"] = [independent_ensemble(singles)]
    if args.latency and ens_rows:
        r = ens_rows[0]
        single = export_run(r["dir"], work / f"{name}_single_export")
        ensemble = export_ensemble(r["dir"], r["ensemble"]["checkpoints"], work / f"{name}_ens")
        result["latency"] = latency(single, ensemble, shards)
    return result


def _line(
    label: str, aucs: list[float], pairs: list[dict], pooled: dict | None = None, extra: str = ""
) -> str:
    """One table row: the seeds' mean test AUC, their deltas against sk_lr with the widest
    interval, how many seeds' intervals exclude 0, and ``pooled`` (``paired_over_seeds``) as
    the mean over seeds' interval (empty for one seed)."""
    mean = statistics.fmean(aucs)
    std = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
    deltas = [p["delta"] for p in pairs]
    better = sum(p["verdict"] == "better" for p in pairs)
    worse = sum(p["verdict"] == "worse" for p in pairs)
    lo = min(p["ci_low"] for p in pairs)
    hi = max(p["ci_high"] for p in pairs)
    over = (
        f"{pooled['delta']:+.4f} [{pooled['ci_low']:+.4f}, {pooled['ci_high']:+.4f}]"
        if pooled
        else ""
    )
    return (
        f"| {label} | {mean:.4f} ± {std:.4f} | {statistics.fmean(deltas):+.4f} "
        f"[{lo:+.4f}, {hi:+.4f}] | {better} / {worse} | {over} |{extra}"
    )


def report(result: dict[str, Any]) -> dict[str, Any]:
    base, y = result["baselines"], result["baselines"]["labels"]
    control = base["sk_lr"][2]
    print(f"\n== {result['name']} (test rows {y.size:,}, clicks {int(y.sum()):,})")
    print(
        "| method | test AUC | vs sk_lr: mean diff [widest 95% CI] | seeds better / worse "
        "| vs sk_lr: mean over seeds [95% CI] |"
    )
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {"name": result["name"], "rows": {}}
    for key in [k for k in ("sk_lr", "xgboost") if k in base]:
        v, how, p = base[key]
        auc = roc_auc_score(y, p)
        pair = paired(y, control, p)
        print(_line(f"{key} ({how})", [auc], [pair]))
        summary["rows"][key] = {"auc": auc, "chosen": how, "validation_auc": v}
    for method, runs in result["rows"].items():
        aucs = [
            roc_auc_score(y, r["scores"]) if r["test_auc"] is None else r["test_auc"] for r in runs
        ]
        variants = [(method, [r["scores"] for r in runs], aucs)]
        if runs and "ensemble" in runs[0]:
            variants.append(
                (
                    "dcn_ensemble (the ensemble)",
                    [r["ensemble"]["scores"] for r in runs],
                    [r["ensemble"]["test_auc"] for r in runs],
                )
            )
            variants[0] = ("dcn_ensemble_best (its best checkpoint)", *variants[0][1:])
        for label, scores, aucs in variants:
            pairs = [paired(y, control, s) for s in scores]
            pooled = (
                paired_over_seeds(y, [control] * len(scores), scores) if len(scores) > 1 else None
            )
            steps = statistics.fmean(r["steps"] for r in runs)
            secs = statistics.fmean(r["seconds"] for r in runs)
            print(_line(label, aucs, pairs, pooled, f" {steps:.0f} steps, {secs:.0f} s"))
            summary["rows"][label] = {"aucs": aucs, "deltas": [p["delta"] for p in pairs]}
            if pooled:
                summary["rows"][label]["over_seeds"] = pooled
        if runs and "ensemble" in runs[0]:
            pairs = [
                paired(y, r["scores"], r["ensemble"]["scores"]) for r in runs
            ]  # the ensemble against its own best checkpoint
            members = [r["ensemble"]["members"] for r in runs]
            snaps = [r["ensemble"]["snapshots"] for r in runs]
            pooled = paired_over_seeds(
                y, [r["scores"] for r in runs], [r["ensemble"]["scores"] for r in runs]
            )
            print(
                "ensemble vs its best checkpoint: "
                + ", ".join(
                    f"{p['delta']:+.4f} [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}]" for p in pairs
                )
                + f"; mean over seeds {pooled['delta']:+.4f} [{pooled['ci_low']:+.4f}, "
                f"{pooled['ci_high']:+.4f}]; members {members} of snapshots {snaps}"
            )
            summary["ensemble_vs_best"] = [p["delta"] for p in pairs]
            summary["ensemble_vs_best_over_seeds"] = pooled
    if result["latency"]:
        lat = result["latency"]
        print(
            f"serving latency (512 rows): single {lat['single']:.2f} ms, ensemble "
            f"{lat['ensemble']:.2f} ms, ratio {lat['ratio']:.2f}"
        )
        summary["latency"] = lat
    return summary


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__, "movielens,movielens_time,open_bandit,synthetic", 8000)
    p.add_argument("--epochs", type=int, default=0, help="0: the config default")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--latency", action="store_true", help="time the ensemble's export")
    p.add_argument("--no-xgboost", action="store_true", help="the LR baseline only")
    p.add_argument(
        "--continue-over-validation",
        action="store_true",
        help="also continue every run over its validation rows for one epoch and compare it "
        "with scikit-learn's LR refit on the training and validation rows "
        "(bench.training.continued)",
    )
    p.add_argument(
        "--recent-validation",
        type=float,
        default=0.0,
        help="movielens_time: validate on this fraction of the most recent training ratings "
        "(0: a random tenth of them)",
    )
    p.add_argument(
        "--ensemble-cycles-per-epoch",
        type=int,
        default=1,
        help="dcn_ensemble: cycles of the cyclic schedule per epoch (1: the default, one)",
    )
    p.add_argument(
        "--ensemble-learning-rate",
        type=float,
        default=0.0,
        help="dcn_ensemble: the top of every cycle (0: the config default)",
    )
    p.add_argument("--json", default="", help="write the summary here")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"tensorflow {tf.__version__}, seeds 0..{args.seeds - 1}, epochs {args.epochs or 'default'}"
    )
    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            work = Path(args.work or tmp) / name.strip()
            result = bench_dataset(name.strip(), args, work)
            if result is not None:
                summaries.append(report(result))
            if result is not None and "continued" in result:
                summaries.append(report(result["continued"]))
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1, default=float))


if __name__ == "__main__":
    main()
