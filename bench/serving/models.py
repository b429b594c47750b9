"""The models bench/serving loads and the request files it sends them.

- ``bench``: DCN-v2 trained for one epoch on a synthetic click log (Criteo layout cut to 4
  numeric + 8 categorical fields, seed 0), exported by ``pipelines.export``; requests from its
  test split.
- ``demo``: the model ``make run`` serves, the default export of ``stitchrec demo`` (39 fields,
  DCN-v2, embedding 16, MLP 256-128), built under the cache when no ``--saved-model`` is given;
  requests from a small synthetic data set of the same layout and seed.
- ``linear``: the hand-checkable linear model of ``serving.testing`` (``--quick`` checks).

A request carries one user (the schema's ``group = "user"`` fields, else C1 and C2) and N
candidates. ``make_requests`` writes the same examples as RankingService RankRequests, KServe v2
ModelInferRequests (the user tiled to N rows) and TF Serving PredictRequests (one
``tf.make_tensor_proto`` tensor of N values per input).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from bench.serving.loadgen import write_requests
from features import synthetic, synthetic_config
from pipelines.config import DataConfig, PipelineConfig, TrainConfig
from pipelines.demo import run_demo
from pipelines.export import export_run
from pipelines.train import train
from protos import grpc_service_pb2 as kserve_pb2
from ranking.config import ModelConfig
from serving.client import make_request
from serving.codec import encode_bytes
from serving.testing import write_linear_model

MODEL = "ctr"
DEFAULT_USER_FIELDS = ("C1", "C2")
PROTOCOLS = ("rank", "kserve", "predict")


def build_bench_model(cache: Path, rows: int) -> tuple[Path, Path]:
    """Trains and exports the bench model once (cached): (SavedModel, test split folder)."""
    model_dir = cache / f"model-{rows}"
    saved = model_dir / "export"
    data_dir = model_dir / "data"
    if (saved / "saved_model.pb").exists():
        return saved, data_dir / "test"
    cfg = synthetic_config.SyntheticConfig(
        rows=rows,
        num_numeric=4,
        num_categorical=8,
        vocab_sizes=(1000, 500, 50, 20, 10, 30, 80, 5),
        n_pairs=1,
        n_triples=1,
        n_single=2,
        seed=0,
    )
    if not (data_dir / "ground_truth.json").exists():
        synthetic.write_dataset(cfg, data_dir)
    pc = PipelineConfig(
        output_dir=str(model_dir / "run"),
        data=DataConfig(
            schema=str(data_dir / "schema.toml"),
            train=(str(data_dir / "train"),),
            test=(str(data_dir / "test"),),
        ),
        model=ModelConfig(type="dcn_v2", embedding_dim=8, mlp=(64, 32), cross_layers=2),
        train=TrainConfig(batch_size=512, epochs=1, learning_rate=2e-3, log_every=10**6),
    )
    report = train(pc, log=lambda _: None)
    export_run(model_dir / "run", saved)
    (model_dir / "train.json").write_text(json.dumps(report["test"]))
    return saved, data_dir / "test"


def build_demo_model(cache: Path, rows: int, saved_model: str | None) -> tuple[Path, Path]:
    """The demo's export (``saved_model``, or ``stitchrec demo`` run once under the cache with
    ``rows`` rows) and a test split of the demo's layout to draw requests from."""
    data = cache / "demo-requests"
    if not (data / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=20_000, seed=0), data)
    if saved_model:
        saved = Path(saved_model)
        if not (saved / "saved_model.pb").exists():
            raise ValueError(f"--saved-model {saved}: no saved_model.pb; expected an export")
        return saved, data / "test"
    out = cache / f"demo-{rows}"
    marker = out / "bench-export.txt"
    if not marker.exists():
        summary = run_demo(rows=rows, output=out, log=lambda _: None)
        marker.write_text(summary["artifacts"]["saved_model"])
    return Path(marker.read_text()), data / "test"


def build_linear_model(cache: Path) -> tuple[Path, None]:
    saved = cache / "linear"
    if not (saved / "saved_model.pb").exists():
        write_linear_model(saved, bias=0.0)
    return saved, None


def _inputs(saved: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """The model's inputs and their kind (string|int64|float32) from assets.extra, and the
    user fields."""
    fields = tomllib.loads((saved / "assets.extra" / "schema.toml").read_text())["fields"]
    meta = json.loads((saved / "assets.extra" / "stitchrec.json").read_text())
    kinds = {}
    for f in fields:
        if f["name"] not in meta["inputs"]:
            continue
        if f.get("kind") == "numeric":
            kinds[f["name"]] = "float32"
        elif f.get("dtype") == "int64":
            kinds[f["name"]] = "int64"
        else:
            kinds[f["name"]] = "string"
    user = tuple(f["name"] for f in fields if f.get("group") == "user" and f["name"] in kinds)
    return kinds, user or DEFAULT_USER_FIELDS


def _rows(test_dir: Path | None, kinds: dict[str, str], n: int) -> dict[str, np.ndarray]:
    if test_dir is None:  # the linear model: seeded random values
        rng = np.random.default_rng(0)
        gen = {
            "string": lambda: np.array([f"u{i}" for i in rng.integers(0, 50, n)], dtype=object),
            "int64": lambda: rng.integers(0, 1000, n),
            "float32": lambda: rng.random(n, dtype=np.float32),
        }
        return {k: gen[kind]() for k, kind in kinds.items()}
    table = pq.read_table(test_dir).slice(0, n)
    if table.num_rows < n:
        raise ValueError(f"{test_dir}: {table.num_rows} test rows; the requests need {n}")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _column(values: np.ndarray, kind: str) -> np.ndarray:
    if kind == "string":
        return np.array([b"" if v is None else str(v).encode() for v in values], dtype=object)
    if kind == "int64":
        return np.nan_to_num(values.astype(np.float64)).astype(np.int64)
    return np.nan_to_num(values.astype(np.float64)).astype(np.float32)


def _kserve(features: dict[str, np.ndarray], kinds: dict[str, str], n: int) -> bytes:
    dtypes = {"string": "BYTES", "int64": "INT64", "float32": "FP32"}
    req = kserve_pb2.ModelInferRequest(model_name=MODEL)
    for k in sorted(kinds):
        v = features[k]
        req.inputs.add(name=k, datatype=dtypes[kinds[k]], shape=[n, 1])
        if kinds[k] == "string":
            req.raw_input_contents.append(encode_bytes(v))
        else:
            req.raw_input_contents.append(v.astype(v.dtype.newbyteorder("<")).tobytes())
    req.outputs.add(name="score")
    return req.SerializeToString()


def _predict(features: dict[str, np.ndarray], kinds: dict[str, str]) -> bytes:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = MODEL
    for k in sorted(kinds):
        v = features[k]
        tensor = tf.make_tensor_proto(list(v) if kinds[k] == "string" else v)
        req.inputs[k].CopyFrom(tensor)
    return req.SerializeToString()


def make_requests(saved: Path, test_dir: Path | None, n: int, count: int, out: Path) -> dict:
    """``count`` requests of N candidates in every protocol: {"paths": {protocol: file},
    "<protocol>_bytes": size of the first}."""
    kinds, user_fields = _inputs(saved)
    data = _rows(test_dir, kinds, count * n + count)
    cols = {k: _column(data[k], kind) for k, kind in kinds.items()}
    msgs: dict[str, list[bytes]] = {p: [] for p in PROTOCOLS}
    for r in range(count):
        sl = slice(count + r * n, count + (r + 1) * n)
        user = {k: cols[k][r : r + 1] for k in user_fields}
        cands = {k: cols[k][sl] for k in kinds if k not in user_fields}
        msgs["rank"].append(make_request(MODEL, user, cands).SerializeToString())
        tiled = {**cands, **{k: np.repeat(v, n) for k, v in user.items()}}
        msgs["kserve"].append(_kserve(tiled, kinds, n))
        msgs["predict"].append(_predict(tiled, kinds))
    result: dict = {"paths": {}}
    for proto, ms in msgs.items():
        result["paths"][proto] = out / f"{proto}-{n}.bin"
        write_requests(str(result["paths"][proto]), ms)
        result[f"{proto}_bytes"] = len(ms[0])
    return result
