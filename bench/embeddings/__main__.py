"""bench/embeddings: test AUC against serving bytes for every embedding method.

    .venv/bin/python -m bench.embeddings --dataset movielens --seeds 0 1 2
    .venv/bin/python -m bench.embeddings --dataset synthetic --seeds 0 --rows 2000000
    .venv/bin/python -m bench.embeddings --plan-only     # the runs it would train, as JSON lines
    .venv/bin/python -m bench.embeddings --plot-only     # redraw the plot from results.json

Every method trains the same model with the same budget on the same split; only the embedding
layer of the large categorical fields changes:

* ``full`` (the baseline), ``amtl`` (its own learned size; ``learned`` is the paper's
  objective, ``penN`` adds a price ``N * mean(k) / d`` on length),
* ``hashing``, ``qr`` and ``bh`` at compression ratios 2x, 10x, 100x, 1000x of the full table's
  serving bytes where the method can reach them (``options_for_ratio``).

For each run it reports the test AUC, the embedding bytes serving holds (``memory_bytes``), the
SavedModel's ``variables/`` bytes on disk and, for one seed, the resident memory (VmRSS) of a
fresh process that loads the SavedModel and scores a batch, minus that of a process that imported
TensorFlow and ran one op. Ratios are against the ``full`` run of the same seed. It prints a
table, writes ``results.json`` and a PNG plot of AUC against serving bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from bench.rss import serving_rss_kb
from features import synthetic, synthetic_config
from features.schema import load_schema
from pipelines.config import DataConfig, PipelineConfig, TrainConfig
from pipelines.export import export_saved_model, saved_model_bytes
from pipelines.run.model import load_trained_model
from pipelines.train import train
from ranking.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
SIZED_METHODS = ("hashing", "qr", "bh")
RATIOS = (2, 10, 100, 1000)

MODELS = {
    # only movieId (8,959 rows) is compressed; userId (611), genres and time buckets stay full
    "movielens": ModelConfig(
        type="dcn_v2",
        embedding_dim=24,
        mlp=(128, 64),
        cross_layers=3,
        l2=1e-4,
        compress_min_rows=1000,
    ),
    # only C3 (about 1.17M rows) is compressed; the other fields keep full tables
    "synthetic": ModelConfig(
        type="dnn", embedding_dim=16, mlp=(256, 128), compress_min_rows=100_000
    ),
}


def serving_rss_mb(model_dir: Path | None, data_dir: Path) -> float:
    """VmRSS of a fresh process after loading ``model_dir`` and scoring one batch, in MB."""
    return serving_rss_kb(model_dir, data_dir)[1] / 1024


def movielens(work: Path, shared: Path) -> tuple[DataConfig, TrainConfig]:
    data = DataConfig(
        schema="movielens",
        raw=(str(shared / "movielens-latest-small" / "ratings.csv"),),
        test_fraction=0.2,
        split_seed=0,
    )
    return data, TrainConfig(batch_size=256, epochs=3, learning_rate=1e-3, log_every=10**6)


def large_synthetic(work: Path, rows: int) -> tuple[DataConfig, TrainConfig]:
    """Criteo layout with C3 made huge and flat: 4M values, Zipf 0.5 (about 1.4M distinct in
    2M rows), every value seen once kept in its vocabulary (min_count 1)."""
    data_dir = work / "synthetic-data"
    sizes = list(synthetic_config.DEFAULT_VOCAB_SIZES)
    sizes[2] = 4_000_000
    exponents = [1.1] * len(sizes)
    exponents[2] = 0.5
    cfg = synthetic_config.SyntheticConfig(
        rows=rows, vocab_sizes=tuple(sizes), zipf_exponents=tuple(exponents)
    )
    if not (data_dir / "ground_truth.json").exists():
        synthetic.write_dataset(cfg, data_dir)
    schema = load_schema(data_dir / "schema.toml").replace_field("C3", min_count=1)
    schema.save(work / "synthetic-schema.toml")
    data = DataConfig(
        schema=str(work / "synthetic-schema.toml"),
        train=(str(data_dir / "train"),),
        test=(str(data_dir / "test"),),
    )
    return data, TrainConfig(batch_size=2048, epochs=1, learning_rate=2e-3, log_every=10**6)


def run_one(
    work: Path, data: DataConfig, model: ModelConfig, tc: TrainConfig, tag: str
) -> dict[str, Any]:
    out = work / "runs" / tag
    if (out / "bench.json").exists():
        return json.loads((out / "bench.json").read_text())
    cfg = PipelineConfig(output_dir=str(out), data=data, model=model, train=tc)
    t0 = time.time()
    report = train(cfg, log=lambda _: None)
    trained, schema, _ = load_trained_model(out)
    train_bytes = trained.embedding.memory_bytes()["train"]
    saved = export_saved_model(trained, schema, out / "export")
    result = {
        "tag": tag,
        "auc": report["test"]["auc"],
        "logloss": report["test"]["logloss"],
        "embedding_train_bytes": train_bytes,
        "embedding_serve_bytes": trained.embedding.memory_bytes()["serve"],
        "saved_model_variable_bytes": saved_model_bytes(saved)["variables"],
        "seconds": round(time.time() - t0, 1),
        "methods": {t.name: [t.method, dict(t.options)] for t in trained.embedding.tables},
    }
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    return result


def field_serve_bytes(run: Path) -> dict[str, int]:
    """Serving bytes of each field's embedding in a finished run (its serving form)."""
    model, _, _ = load_trained_model(run)
    return {
        name: b["serve"]
        for name, b in model.embedding.serving_form().memory_bytes_by_field().items()
    }


def plan(
    model: ModelConfig, ratios: tuple[int, ...], amtl_penalties: tuple[float, ...]
) -> list[tuple[str, str, ModelConfig]]:
    runs = [("full", "1", dataclasses.replace(model, embedding_method="full"))]
    for penalty in amtl_penalties:
        options = {"amtl": {"length_penalty": penalty}} if penalty else {}
        amtl = dataclasses.replace(model, embedding_method="amtl", embedding_options=options)
        runs.append(("amtl", "learned" if not penalty else f"pen{penalty:g}", amtl))
    for method in SIZED_METHODS:
        for r in ratios:
            runs.append(
                (
                    method,
                    str(r),
                    dataclasses.replace(
                        model, embedding_method=method, embedding_compression=float(r)
                    ),
                )
            )
    return runs


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in ("full", "amtl", *SIZED_METHODS):
        pts = sorted(
            (r["serve_bytes"], r["auc_mean"], r["auc_std"]) for r in rows if r["method"] == method
        )
        if not pts:
            continue
        xs, ys, es = zip(*pts, strict=True)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    ax.set_xlabel("embedding bytes held by serving (log scale)")
    ax.set_ylabel("test AUC (mean ± std over seeds)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=["movielens", "synthetic"], default="movielens")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ratios", type=int, nargs="+", default=list(RATIOS))
    p.add_argument("--rows", type=int, default=2_000_000, help="synthetic rows")
    p.add_argument(
        "--amtl-penalties",
        type=float,
        nargs="+",
        default=[0.0, 0.05],
        help="AMTL length_penalty values (0: the paper's objective)",
    )
    p.add_argument("--out", default=str(ROOT / "runs" / "bench" / "embeddings"))
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="print the planned runs (one JSON object a line) and exit without training",
    )
    p.add_argument(
        "--plot-only",
        action="store_true",
        help="redraw the plot from the dataset's results.json under --out and exit",
    )
    return p.parse_args(argv)


def print_plan(runs: list[tuple[str, str, ModelConfig]]) -> None:
    """One JSON object a line per planned run: its method, ratio tag and embedding settings."""
    for method, ratio, mc in runs:
        print(
            json.dumps(
                {
                    "method": method,
                    "ratio": ratio,
                    "embedding_method": mc.embedding_method,
                    "embedding_compression": mc.embedding_compression,
                    "embedding_options": mc.embedding_options,
                }
            )
        )


def sweep(
    work: Path,
    data: DataConfig,
    runs: list[tuple[str, str, ModelConfig]],
    tc: TrainConfig,
    seeds: list[int],
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every planned run for every seed; a method stops at the first ratio it cannot reach."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for method, ratio, mc in runs:
        for seed in seeds:
            tag = f"{method}-{ratio}-seed{seed}"
            try:
                r = run_one(work, data, mc, dataclasses.replace(tc, seed=seed), tag)
            except ValueError as e:  # a ratio the method cannot reach
                print(f"{tag}: skipped ({e})", flush=True)
                break
            results.setdefault((method, ratio), []).append(r)
            print(
                f"{tag}: auc {r['auc']:.4f} serve {r['embedding_serve_bytes']:,} B "
                f"({r['seconds']} s)",
                flush=True,
            )
    return results


def summary_rows(
    work: Path, results: dict[tuple[str, str], list[dict[str, Any]]], test_dir: Path
) -> tuple[list[dict[str, Any]], str]:
    """One row per (method, ratio) with its means over seeds, and the largest field's name."""
    full_serve = statistics.mean(r["embedding_serve_bytes"] for r in results[("full", "1")])
    full_fields = field_serve_bytes(work / "runs" / results[("full", "1")][0]["tag"])
    largest = max(full_fields, key=full_fields.get)
    full_auc = statistics.mean(r["auc"] for r in results[("full", "1")])
    rss_base = serving_rss_mb(None, test_dir)
    rows = []
    for (method, ratio), rs in results.items():
        aucs = [r["auc"] for r in rs]
        serve = statistics.mean(r["embedding_serve_bytes"] for r in rs)
        export = work / "runs" / rs[0]["tag"] / "export"
        rows.append(
            {
                "method": method,
                "target_ratio": ratio,
                "seeds": len(rs),
                "auc_mean": statistics.mean(aucs),
                "auc_std": statistics.stdev(aucs) if len(aucs) > 1 else 0.0,
                "auc_vs_full": statistics.mean(aucs) / full_auc,
                "serve_bytes": serve,
                "ratio": full_serve / serve,
                "largest_field": largest,
                "largest_field_ratio": full_fields[largest]
                / field_serve_bytes(work / "runs" / rs[0]["tag"])[largest],
                "train_bytes": statistics.mean(r["embedding_train_bytes"] for r in rs),
                "saved_model_variable_bytes": rs[0]["saved_model_variable_bytes"],
                "serving_rss_mb": serving_rss_mb(export, test_dir) - rss_base,
            }
        )
    return rows, largest


def print_table(rows: list[dict[str, Any]], dataset: str, seeds: list[int], largest: str) -> None:
    header = (
        f"{'method':8s} {'target':>7s} {'ratio':>8s} {largest + ' ratio':>14s} "
        f"{'AUC mean':>9s} {'± std':>7s} "
        f"{'vs full':>8s} {'serve B':>13s} {'SavedModel var B':>17s} {'RSS MB':>8s}"
    )
    print(
        f"\n{dataset}: seeds {seeds}; ratio: all embedding bytes serving holds, "
        f"against full; {largest} ratio: that field's table alone"
    )
    print(header)
    for r in rows:
        print(
            f"{r['method']:8s} {r['target_ratio']:>7s} {r['ratio']:8.1f} "
            f"{r['largest_field_ratio']:14.1f} {r['auc_mean']:9.4f} "
            f"{r['auc_std']:7.4f} {r['auc_vs_full']:8.4f} {r['serve_bytes']:13,.0f} "
            f"{r['saved_model_variable_bytes']:17,d} {r['serving_rss_mb']:8.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.out) / args.dataset
    png = work / f"auc_vs_serving_bytes_{args.dataset}.png"
    title = f"{args.dataset}: test AUC against serving bytes"
    if args.plot_only:
        plot(json.loads((work / "results.json").read_text()), png, title)
        print(f"wrote {png}")
        return 0
    runs = plan(MODELS[args.dataset], tuple(args.ratios), tuple(args.amtl_penalties))
    if args.plan_only:
        print_plan(runs)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    if args.dataset == "movielens":
        data, tc = movielens(work, Path(args.shared))
    else:
        data, tc = large_synthetic(work, args.rows)
    results = sweep(work, data, runs, tc, args.seeds)
    test_dir = (
        Path(data.test[0])
        if data.test
        else work / "runs" / f"full-1-seed{args.seeds[0]}" / "data" / "test"
    )
    rows, largest = summary_rows(work, results, test_dir)
    print_table(rows, args.dataset, args.seeds, largest)
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    plot(rows, png, title)
    print(f"\nwrote {work / 'results.json'} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
