"""StitchRec's ``lr`` model against scikit-learn's logistic regression on the same split.

Each dataset is converted once (StitchRec's first run writes the train / validation / test
shards); every seed then trains ``type = "lr"`` with the config defaults of a linear model
(docs/training.md#the-logistic-regression-baseline) on those shards, early stopping on the
validation rows. scikit-learn's ``LogisticRegression`` reads the same features, encoded by
the trained model's own preprocessor: one column per id of every categorical field (multi-valued
fields: one per value present, bucketized numeric fields: one per bucket) plus the
standardized numeric columns; its ``C`` is chosen over a small grid on the validation rows
(never on the test rows). Both are scored once on the test rows.

Datasets (``--datasets``, default ``movielens,synthetic``): ``movielens`` (random 80/20 split;
skipped with a message when ``--data-root`` has no MovieLens), ``synthetic``
(``features.synthetic``, ``--rows`` rows, Criteo layout) and ``open_bandit`` (both logging
policies of the "all" campaign, 20,000 rows; its test split holds about 20 clicks, so its AUCs
are mostly noise and it is not run by default).

    python -m bench.training.lr_baseline --seeds 3 --data-root ../shared/data
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from features.dataset import make_dataset
from features.synthetic import write_dataset
from features.synthetic_config import SyntheticConfig
from pipelines.config import PipelineConfig, config_from_dict
from pipelines.run.model import load_trained_model
from pipelines.train import train

REPO = Path(__file__).resolve().parents[2]
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def dataset_configs(name: str, data_root: Path, work: Path, rows: int) -> dict[str, Any] | None:
    """The ``[data]`` section of ``name`` (None, with a message, when its files are absent)."""
    if name == "movielens":
        ratings = data_root / "movielens-latest-small" / "ratings.csv"
        if not ratings.exists():
            print(f"movielens: skipped, {ratings} does not exist")
            return None
        return {"schema": "movielens", "raw": [str(ratings)], "test_fraction": 0.2}
    if name == "open_bandit":
        cells = [data_root / "open-bandit-small" / p / "all" / "all.csv" for p in ("random", "bts")]
        if not all(c.exists() for c in cells):
            print(f"open_bandit: skipped, {cells[0].parent.parent.parent} is incomplete")
            return None
        return {"schema": "open_bandit", "raw": [str(c) for c in cells], "test_fraction": 0.2}
    if name == "synthetic":
        out = work / "synthetic_data"
        write_dataset(SyntheticConfig(rows=rows, n_single=8, seed=0), out, test_fraction=0.2)
        return {
            "schema": str(out / "schema.toml"),
            "train": [str(out / "train")],
            "test": [str(out / "test")],
        }
    raise ValueError(f"dataset {name!r} is not one of movielens, synthetic, open_bandit")


def run_config(data: dict[str, Any], out: Path, seed: int, args: argparse.Namespace) -> Any:
    """The ``lr`` run of one seed; ``[train]`` keys the command line does not set keep the
    config defaults of a linear model."""
    train_keys: dict[str, Any] = {"seed": seed, "log_every": 10**6, "checkpoint_every": 10**6}
    if args.batch_size:
        train_keys["batch_size"] = args.batch_size
    if args.epochs:
        train_keys["epochs"] = args.epochs
    if args.optimizer:
        train_keys["optimizer"] = args.optimizer
    if args.learning_rate:
        train_keys["learning_rate"] = args.learning_rate
    model: dict[str, Any] = {"type": "lr"}
    if args.l2_wide is not None:
        model["l2_wide"] = args.l2_wide
    return config_from_dict(
        {"output_dir": str(out), "data": data, "model": model, "train": train_keys},
        base_dir=REPO,
    )


def converted(first: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``[data]`` reading the first run's split shards (the same rows for every seed)."""
    test = first / "data" / "test"
    return {
        "schema": str(first / "schema.toml"),
        "train": [str(first / "data" / "train")],
        "validation": [str(first / "data" / "validation")],
        "test": [str(test)] if test.exists() else data["test"],
    }


def encode(model: Any, schema: Any, files: list[str]) -> tuple[sp.csr_matrix, np.ndarray]:
    """The rows of ``files`` as the wide term sees them: a one-hot column per table row of
    every embedded field (summed over a multi-valued cell's ids) and the dense columns."""
    pre = model.preprocessor
    sizes = dict(pre.embedded_fields)
    offsets = dict(zip(sizes, np.cumsum([0, *sizes.values()])[:-1], strict=True))
    width = int(sum(sizes.values()))
    blocks, labels = [], []
    for batch in make_dataset(schema, files, batch_size=8192):
        ids, dense = pre(batch)
        n = int(batch[model.label].shape[0])
        rows, cols = [], []
        for name, x in ids.items():
            if isinstance(x, tf.RaggedTensor):
                r = x.value_rowids().numpy()
                v = x.flat_values.numpy()
            else:
                r, v = np.arange(n), x.numpy().reshape(-1)
            rows.append(r)
            cols.append(v + offsets[name])
        onehot = sp.csr_matrix(
            (np.ones(sum(len(r) for r in rows)), (np.concatenate(rows), np.concatenate(cols))),
            shape=(n, width),
        )
        parts = [onehot] + ([sp.csr_matrix(dense.numpy())] if dense is not None else [])
        blocks.append(sp.hstack(parts, format="csr"))
        labels.append(batch[model.label].numpy())
    return sp.vstack(blocks, format="csr"), np.concatenate(labels)


def sklearn_baseline(run_dir: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``LogisticRegression`` with ``C`` chosen on the validation rows, scored on the test rows."""
    model, schema, _ = load_trained_model(run_dir)
    x_tr, y_tr = encode(model, schema, data["train"])
    x_va, y_va = encode(model, schema, data["validation"])
    x_te, y_te = encode(model, schema, data["test"])
    best = None
    for c in C_GRID:
        lr = LogisticRegression(C=c, max_iter=2000, solver="lbfgs").fit(x_tr, y_tr)
        val = roc_auc_score(y_va, lr.decision_function(x_va))
        if best is None or val > best[0]:
            best = (val, c, lr)
    val, c, lr = best
    return {
        "C": c,
        "validation_auc": val,
        "test_auc": roc_auc_score(y_te, lr.decision_function(x_te)),
        "l2_wide_equivalent": 1 / (2 * c * len(y_tr)),
    }


def bench_dataset(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    data = dataset_configs(name, Path(args.data_root), work, args.rows)
    if data is None:
        return None
    quiet = lambda _line: None  # noqa: E731 - the bench prints its own summary
    first = work / f"{name}_seed0"
    runs, cfg0 = [], None
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        cfg = run_config(
            data if seed == 0 else converted(first, data), work / f"{name}_seed{seed}", seed, args
        )
        cfg0 = cfg0 or cfg
        report = train(cfg, quiet)
        runs.append(
            {
                "seed": seed,
                "auc": report["test"]["auc"],
                "validation_auc": report["selection"]["best"]["auc"],
                "epochs": len(report["epochs"]),
                "steps": report["steps"],
                "seconds": time.perf_counter() - t0,
            }
        )
    sk = sklearn_baseline(first, converted(first, data))
    aucs = [r["auc"] for r in runs]
    diffs = [a - sk["test_auc"] for a in aucs]
    return {"name": name, "cfg": cfg0, "runs": runs, "sklearn": sk, "aucs": aucs, "diffs": diffs}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.4f} ± {std:.4f}"


def report(result: dict[str, Any]) -> None:
    cfg: PipelineConfig = result["cfg"]
    tc, sk = cfg.train, result["sklearn"]
    aucs = result["aucs"]
    std = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
    print(f"\n== {result['name']}")
    print(
        f"stitchrec lr: optimizer {tc.optimizer} lr {tc.learning_rate} "
        f"l2_wide {cfg.model.l2_wide:g} batch {tc.batch_size} max epochs {tc.epochs}"
    )
    for r in result["runs"]:
        print(
            f"  seed {r['seed']}: test auc {r['auc']:.4f}, best validation auc "
            f"{r['validation_auc']:.4f} ({r['epochs']} epochs, {r['steps']} steps, "
            f"{r['seconds']:.0f}s)"
        )
    print(
        f"sklearn LogisticRegression: C {sk['C']} (validation auc {sk['validation_auc']:.4f}; "
        f"= l2_wide {sk['l2_wide_equivalent']:.2e}) test auc {sk['test_auc']:.4f}"
    )
    ratio = statistics.fmean(aucs) / sk["test_auc"]
    print(
        f"test auc stitchrec {statistics.fmean(aucs):.4f} ± {std:.4f} vs sklearn "
        f"{sk['test_auc']:.4f}: difference {mean_std(result['diffs'])}, ratio {ratio:.4f}"
        f" ({'within' if abs(statistics.fmean(result['diffs'])) <= 0.002 else 'outside'} 0.002)"
    )


def bench_parser(doc: str, datasets: str, rows: int) -> argparse.ArgumentParser:
    """The flags every bench/training script has: datasets, data root, seeds, synthetic rows,
    the folder of the runs."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--datasets", default=datasets)
    p.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rows", type=int, default=rows, help="synthetic rows")
    p.add_argument("--work", default="", help="run folders (default: a temporary folder)")
    return p


def run_bench(args: Any, settings: str, body: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Prints the machine, TensorFlow version and ``settings``, runs ``body(work)`` in
    ``args.work`` (default: a temporary folder), adds its wall ``seconds`` to the results and
    writes them to ``args.json`` when set."""
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"tensorflow {tf.__version__}, {settings}"
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = body(Path(args.work or tmp))
    results["seconds"] = time.perf_counter() - t0
    print(f"\nbench seconds: {results['seconds']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return results


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__, "movielens,synthetic", 15_000)
    p.add_argument("--epochs", type=int, default=0, help="at most (default: the config default)")
    p.add_argument("--batch-size", type=int, default=0, help="default: the config default")
    p.add_argument("--optimizer", default="", help="default: the lr model's config default")
    p.add_argument("--learning-rate", type=float, default=0.0, help="default: as --optimizer")
    p.add_argument("--l2-wide", type=float, default=None, help="default: the config default")
    args = p.parse_args(argv)
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"tensorflow {tf.__version__}, seeds 0..{args.seeds - 1}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        for name in args.datasets.split(","):
            result = bench_dataset(name.strip(), args, work)
            if result is not None:
                report(result)


if __name__ == "__main__":
    main()
