"""bench/ab: speed targets, A/A calibration, and example reports of ``stitchrec ab``.

    .venv/bin/python -m bench.ab --out runs/bench_ab            # everything, full size
    .venv/bin/python -m bench.ab --out runs/bench_ab --rows 100000 --resamples 100 --aa-seeds 100

1. speed (no bootstrap): ``run_ab`` end to end on synthetic logs of ``--rows`` rows (Parquet) with
   two Parquet score files in shuffled row order: read, align, AUC / GAUC / logloss /
   calibration / NDCG@5,10 / recall@5,10 overall and per slice of one field, JSON + HTML.
   Target: 1M rows in 30 s.
2. speed (bootstrap): ``compare_scores`` with ``--resamples`` paired resamples of the same rows
   (row metrics and grouped metrics). Target: 1,000 resamples of 1M rows in 120 s on 2 cores.
   Baseline in the same run: the textbook loop (take the resampled rows, scikit-learn AUC and
   log loss per model), timed on a few resamples and scaled to ``--resamples``.
3. A/A calibration: two equally good synthetic models on ``--aa-seeds`` seeds (false-alarm rate
   of the 95% verdict, with its binomial standard error) and the power against a planted
   improvement.
4. Example on real data (Open Bandit, ``--obd``): LR and DCN-v2 trained on the Bernoulli-TS logs,
   compared on the uniform-random logs, with off-policy estimates of both models' policies.

Prints absolute seconds, the ratio to each target (< 1 meets it) and the machine load; writes
``results.json`` and example reports (``*/ab.html``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from pipelines.evaluation import ab_run, compare, report

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
TARGET_POINT_S = 30.0
TARGET_BOOT_S = 120.0

LOG_SCHEMA = """
name = "bench_ab"
[source]
format = "parquet"
[[fields]]
name = "user"
kind = "categorical"
dtype = "int64"
[[fields]]
name = "device"
kind = "categorical"
[[fields]]
name = "click"
kind = "label"
"""


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def synthetic_logs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Users with 10 impressions on average, a 5-value slice field, CTR about 5%, and two
    models that see the true logit through noise (the treatment less noisy)."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, max(rows // 10, 1), rows)
    device = np.array(["ios", "android", "web", "tv", "other"])[
        rng.choice(5, rows, p=[0.4, 0.35, 0.2, 0.04, 0.01])
    ]
    z = rng.normal(size=rows) + 0.3 * (user % 5 == 0)
    click = (rng.random(rows) < 1 / (1 + np.exp(-(1.2 * z - 3.2)))).astype(np.float32)
    control = 1 / (1 + np.exp(-(1.2 * (z + 0.9 * rng.normal(size=rows)) - 3.4)))
    treatment = 1 / (1 + np.exp(-(1.2 * (z + 0.8 * rng.normal(size=rows)) - 3.3)))
    return {
        "user": user,
        "device": device,
        "click": click,
        "control": control,
        "treatment": treatment,
    }


def bench_point(out: Path, rows: int) -> dict[str, Any]:
    d = synthetic_logs(rows)
    data = out / "synthetic" / "logs"
    data.mkdir(parents=True, exist_ok=True)
    (data / "schema.toml").write_text(LOG_SCHEMA)
    pq.write_table(
        pa.table({"user": d["user"], "device": d["device"], "click": d["click"]}),
        data / "part-00000.parquet",
    )
    perm = np.random.default_rng(1).permutation(rows)
    for m in ("control", "treatment"):
        pq.write_table(
            pa.table({"row_id": perm, "score": d[m][perm]}), out / "synthetic" / f"{m}.parquet"
        )
    opts = ab_run.ABOptions(
        control=str(out / "synthetic" / "control.parquet"),
        treatment=str(out / "synthetic" / "treatment.parquet"),
        data=[str(data)],
        output=str(out / "synthetic" / "point"),
        group="user",
        slices=["device"],
        resamples=0,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    res = ab_run.run_ab(opts, log=lambda _m: None)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"[speed, no bootstrap] {rows:,} rows x 2 models end to end: {elapsed:.1f} s wall, "
        f"{cpu:.1f} s CPU (target {TARGET_POINT_S:.0f} s: ratio {elapsed / TARGET_POINT_S:.2f} "
        f"wall, {cpu / TARGET_POINT_S:.2f} CPU); {_load()}"
    )
    return {"rows": rows, "seconds": elapsed, "cpu_seconds": cpu, "target_s": TARGET_POINT_S,
            "ratio_to_target": elapsed / TARGET_POINT_S, "timing_s": res["timing_s"],
            "load": _load()}  # fmt: skip


def bench_bootstrap(
    out: Path, rows: int, resamples: int, slices: bool, workers: int
) -> dict[str, Any]:
    from sklearn.metrics import log_loss, roc_auc_score

    d = synthetic_logs(rows)
    kw = {"groups": d["user"], "slices": {"device": d["device"]} if slices else None}
    t0, c0 = time.perf_counter(), time.process_time()
    res = compare.compare_scores(
        d["click"], d["control"], d["treatment"], resamples=resamples, seed=0, workers=workers, **kw
    )
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    # baseline: the textbook loop, timed on a few resamples
    few = 3
    rng = np.random.default_rng(0)
    t1 = time.perf_counter()
    for _ in range(few):
        idx = rng.integers(0, rows, rows)
        for m in ("control", "treatment"):
            roc_auc_score(d["click"][idx], d[m][idx])
            log_loss(d["click"][idx], np.clip(d[m][idx], 1e-7, 1 - 1e-7))
    base = (time.perf_counter() - t1) / few * resamples
    res["verdict"] = compare.verdict(res, "auc")
    path = out / "synthetic" / "bootstrap"
    path.mkdir(parents=True, exist_ok=True)
    res = compare.clean_json(res)
    res["control"] = {"source": "synthetic control (noise 0.9)"}
    res["treatment"] = {"source": "synthetic treatment (noise 0.8)"}
    res["data"] = {"files": [f"synthetic logs, {rows:,} rows"]}
    res["group_field"] = "user"
    (path / "ab.json").write_text(json.dumps(res, indent=1))
    (path / "ab.html").write_text(report.html(res))
    print(report.console(res))
    what = "overall + grouped" + (" + 5 slices" if slices else "")
    print(
        f"[speed, bootstrap] {resamples} paired resamples of {rows:,} rows x 2 models ({what}): "
        f"{elapsed:.1f} s (points {res['timing_s']['points']:.1f} s, resampling "
        f"{res['timing_s']['bootstrap']:.1f} s), {cpu:.1f} s CPU, {workers} thread(s); target "
        f"{TARGET_BOOT_S:.0f} s: ratio {elapsed / TARGET_BOOT_S:.2f} wall, "
        f"{cpu / TARGET_BOOT_S:.2f} CPU; textbook loop (AUC + logloss only) would take "
        f"{base:.0f} s: {base / elapsed:.1f}x slower; {_load()}"
    )
    return {"rows": rows, "resamples": resamples, "scope": what, "seconds": elapsed,
            "cpu_seconds": cpu, "workers": workers,
            "timing_s": res["timing_s"], "target_s": TARGET_BOOT_S,
            "ratio_to_target": elapsed / TARGET_BOOT_S, "baseline_loop_s": base,
            "speedup_vs_loop": base / elapsed, "load": _load(),
            "auc_delta": res["overall"]["metrics"]["auc"]}  # fmt: skip


def _two_models(seed: int, n: int, noise_c: float, noise_t: float):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * z - 1.5)))).astype(float)

    def model(noise: float) -> np.ndarray:
        return 1 / (1 + np.exp(-(1.5 * (z + noise * rng.normal(size=n)) - 1.5)))

    return y, model(noise_c), model(noise_t)


def bench_aa(seeds: int, n: int, resamples: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"seeds": seeds, "rows": n, "resamples": resamples}
    for label, noise_t in (("aa", 1.0), ("planted", 0.5)):
        alarms = {"auc": 0, "logloss": 0}
        for seed in range(seeds):
            y, a, b = _two_models(seed, n, 1.0, noise_t)
            r = compare.compare_scores(y, a, b, resamples=resamples, seed=seed)
            for m in alarms:
                alarms[m] += r["overall"]["metrics"][m]["verdict"] != "no significant difference"
        rate = {m: v / seeds for m, v in alarms.items()}
        se = {m: float(np.sqrt(p * (1 - p) / seeds)) for m, p in rate.items()}
        out[label] = {"significant_rate": rate, "binomial_se": se}
        name = "A/A false-alarm rate" if label == "aa" else "power vs planted improvement"
        print(
            f"[{name}] {seeds} seeds, n={n}, B={resamples}: "
            + ", ".join(f"{m} {rate[m]:.3f} ± {se[m]:.3f}" for m in rate)
        )
    out["seconds"] = time.perf_counter() - t0
    return out


OBD_CONFIG = """
output_dir = "{out}"
[data]
schema = "open_bandit"
raw = ["{bts}"]
test_fraction = 0.2
split_seed = 0
[model]
type = "{model}"
embedding_dim = 8
mlp = [64, 32]
cross_layers = 2
l2 = 0.01
[train]
batch_size = 256
epochs = 3
learning_rate = 0.001
weight_average = "none"
seed = {seed}
log_every = 1000
"""


def bench_obd(out: Path, resamples: int, seed: int) -> dict[str, Any]:
    from pipelines.config import load_config
    from pipelines.export import export_run
    from pipelines.train import train

    d = SHARED / "open-bandit-small"
    exports = {}
    for name, model in (("control", "lr"), ("treatment", "dcn_v2")):
        cfg = out / "obd" / f"{name}.toml"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(
            OBD_CONFIG.format(
                out=out / "obd" / name, bts=d / "bts/all/all.csv", model=model, seed=seed
            )
        )
        train(load_config(cfg), log=lambda _m: None)
        exports[name] = export_run(out / "obd" / name)
    opts = ab_run.ABOptions(
        control=str(exports["control"]),
        treatment=str(exports["treatment"]),
        data=[str(d / "random/all/all.csv")],
        schema="open_bandit",
        output=str(out / "obd" / "report"),
        slices=["position", "user_feature_0"],
        resamples=resamples,
        seed=seed,
        action="item_id",
        propensity="propensity_score",
        min_slice_rows=500,
    )
    t0 = time.perf_counter()
    res = ab_run.run_ab(opts, log=print)
    elapsed = time.perf_counter() - t0
    print(report.console(res))
    print(f"[Open Bandit example] {elapsed:.1f} s; {_load()}")
    # the issue's check: the uniform policy from the BTS logs vs the random logs' observed CTR
    from pipelines.evaluation import sources

    bts = sources.load_logs([str(d / "bts/all/all.csv")], "open_bandit")
    rnd = sources.load_logs([str(d / "random/all/all.csv")], "open_bandit")
    check = compare.off_policy(
        bts, {"uniform": sources.UniformSource()}, action="item_id",
        propensity="propensity_score", resamples=resamples, seed=seed,
    )  # fmt: skip
    u = check["policies"]["uniform"]
    print(
        f"[OBD check] random logs observed CTR {rnd.labels.mean():.5f} "
        f"({int(rnd.labels.sum())} clicks / {rnd.n}); uniform policy estimated from the BTS logs: "
        + ", ".join(
            f"{e.upper()} {v['value']:.5f} [{v['ci'][0]:.5f}, {v['ci'][1]:.5f}]"
            for e, v in u["estimates"].items()
        )
    )
    return {"seconds": elapsed, "result_path": str(out / "obd" / "report" / "ab.json"),
            "overall": res["overall"]["metrics"], "verdict": res["verdict"],
            "off_policy": res.get("off_policy"), "check_uniform_from_bts": check,
            "random_observed_ctr": float(rnd.labels.mean()), "load": _load()}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/bench_ab")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--aa-seeds", type=int, default=1000)
    p.add_argument("--aa-rows", type=int, default=600)
    p.add_argument("--slices", action="store_true", help="bootstrap the device slices too")
    p.add_argument("--no-obd", action="store_true", help="skip the Open Bandit example")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="bootstrap threads")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": _load()}
    results["speed_point"] = bench_point(out, args.rows)
    results["speed_bootstrap"] = bench_bootstrap(
        out, args.rows, args.resamples, args.slices, args.workers
    )
    if args.aa_seeds:
        results["aa"] = bench_aa(args.aa_seeds, args.aa_rows, 300)
    if not args.no_obd:
        results["open_bandit"] = bench_obd(out, args.resamples, args.seed)
    (out / "results.json").write_text(json.dumps(compare.clean_json(results), indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
