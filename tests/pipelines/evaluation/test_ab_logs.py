"""`stitchrec ab` on a server's prediction log: joined with outcomes it gives the report of the
same rows as a plain data file; logged:ARM / logged:vN scores, the unpaired arm comparison and
its errors."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from pipelines.cli import main
from ranking import metrics as M
from serving.calls import ScoredCall
from serving.config import ServerOptions
from serving.log_format import read_logs
from serving.prediction_log import PredictionLogger
from serving.testing import SCHEMA, ServerThread, features, reference_score, write_linear_model
from serving.version_files import write_marker

LABELLED_SCHEMA = SCHEMA + '\n[[fields]]\nname = "click"\nkind = "label"\n'
CALLS = 120


def _predict(stub, version: int, feats: dict[str, np.ndarray], request_id: str) -> None:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    req.model_spec.version.value = version
    for k, v in feats.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    stub.Predict(req, timeout=20, metadata=[("x-request-id", request_id)])


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A prediction log of 120 calls of 3 rows over versions 1 and 2, outcomes for 110 calls."""
    d = tmp_path_factory.mktemp("ablogs")
    for v, bias in ((1, -0.5), (2, 0.5)):
        path = write_linear_model(d / "repo" / "lin" / str(v), bias=bias)
        # the schema `ab` reads a SavedModel's task from names the label
        (path / "assets.extra" / "schema.toml").write_text(LABELLED_SCHEMA)
        write_marker(path)
    options = ServerOptions(policy="all", log_dir=str(d / "logs"), log_flush_s=30.0)
    rng = np.random.default_rng(7)
    with ServerThread(d / "repo", options) as s:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(s.target))
        for i in range(CALLS):
            users = [f"u{j}" for j in rng.integers(0, 3, 3)]
            feats = features(users, rng.integers(0, 6, 3).tolist(), rng.normal(size=3).tolist())
            _predict(stub, 1 + i % 2, feats, f"r{i}")
    table = read_logs([d / "logs"])
    user = [u.decode() for u in table.column("feature.user").to_pylist()]
    item, price = (
        table.column("feature.item").to_pylist(),
        table.column("feature.price").to_pylist(),
    )
    click = [
        int(rng.random() < reference_score(0.0, u, i, p))
        for u, i, p in zip(user, item, price, strict=True)
    ]
    outcomes = pa.table(
        {"request_id": table.column("request_id"), "row": table.column("row"), "click": click}
    )
    kept = pc.invert(
        pc.is_in(outcomes.column("request_id"), pa.array([f"r{i}" for i in range(10)]))
    )
    pq.write_table(outcomes.filter(kept), d / "outcomes.parquet")
    plain = pa.table({"user": user, "item": item, "price": price, "click": click}).filter(kept)
    pq.write_table(plain, d / "plain.parquet")
    (d / "schema.toml").write_text(LABELLED_SCHEMA)
    return {"dir": d, "log": table.filter(kept), "click": np.array(click)[kept.to_numpy()]}


def _ab(d, out: str, *args: str) -> dict:
    argv = ["ab", "--schema", str(d / "schema.toml"), "--bootstrap", "100", "--no-html"]
    assert main([*argv, "--output", str(d / out), *args]) == 0
    return json.loads((d / out / "ab.json").read_text())


def test_ab_on_the_log_equals_ab_on_the_same_rows_as_a_data_file(logged):
    d = logged["dir"]
    models = ["--control", str(d / "repo/lin/1"), "--treatment", str(d / "repo/lin/2")]
    joined = ["--data", str(d / "logs"), "--join", str(d / "outcomes.parquet")]
    on_log = _ab(d, "on_log", *models, *joined, "--on", "request_id")
    on_file = _ab(d, "on_file", *models, "--data", str(d / "plain.parquet"))
    assert on_log["rows"] == on_file["rows"] == 3 * (CALLS - 10)
    assert on_log["data"]["rows_without_outcome"] == 30
    assert on_log["overall"]["metrics"] == on_file["overall"]["metrics"]
    assert on_log["verdict"] == on_file["verdict"]


def test_logged_versions_compare_two_populations_unpaired(logged, capsys):
    d, log = logged["dir"], logged["log"]
    res = _ab(
        d,
        "arms",
        *["--control", "logged:v1", "--treatment", "logged:v2"],
        *["--data", str(d / "logs"), "--join", str(d / "outcomes.parquet")],
    )
    assert res["settings"]["pairing"] == "unpaired"
    assert "unpaired comparison of two populations" in capsys.readouterr().out
    version = log.column("version").to_numpy()
    score = log.column("output.score").to_numpy().astype(np.float64)
    for model, v in (("control", 1), ("treatment", 2)):
        rows = version == v
        assert res["populations"][model]["rows"] == rows.sum() == 165
        got = res["overall"]["metrics"]["auc"][model]
        assert got == pytest.approx(M.auc(logged["click"][rows], score[rows]), abs=1e-12)
        assert res["overall"]["metrics"]["mean_score"][model] == pytest.approx(score[rows].mean())
    assert res["overall"]["metrics"]["auc"]["resamples"] == 100


def test_logged_version_against_a_replayed_model_is_paired_on_its_rows(logged):
    d, log = logged["dir"], logged["log"]
    res = _ab(
        d,
        "one_arm",
        *["--control", "logged:v1", "--treatment", str(d / "repo/lin/1")],
        *["--data", str(d / "logs"), "--join", str(d / "outcomes.parquet")],
    )
    assert res["rows"] == 165 and res["settings"].get("pairing", "paired") == "paired"
    m = res["overall"]["metrics"]["logloss"]
    assert m["delta"] == pytest.approx(0.0, abs=1e-6)  # the replay of v1 is v1's logged score
    rows = log.column("version").to_numpy() == 1
    assert m["control"] == pytest.approx(
        M.logloss(logged["click"][rows], log.column("output.score").to_numpy()[rows]), rel=1e-9
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--control", "logged:v9"], "logged:v9: no logged row was served by version 9"),
        (["--control", "logged:stable"], "no logged row was served by arm 'stable'"),
        (["--no-join"], "is a prediction log, which holds no labels: pass --join OUTCOMES"),
        (["--group", "user"], "compares two populations (the rows each arm served) and takes no"),
        (["--join", "plain.parquet"], "has no join column 'request_id'"),
        (["--data", "plain.parquet"], "--join applies to a prediction log"),
        (["--model", "other"], "no prediction log files (*.parquet)"),
        (["--no-join", "", "--data", "plain.parquet"], "logged scores need a prediction log"),
        (["--control", "logged:"], "score source 'logged:': expected logged:ARM or logged:vN"),
    ],
)
def test_ab_on_logs_errors_are_one_line(logged, capsys, args, message):
    d = logged["dir"]
    opts = {
        "--control": "logged:v1",
        "--treatment": "logged:v2",
        "--data": str(d / "logs"),
        "--join": str(d / "outcomes.parquet"),
        "--schema": str(d / "schema.toml"),
    }
    extra = []
    for i in range(0, len(args), 2):
        if args[i] == "--no-join":
            opts.pop("--join")
        elif args[i] in opts:
            value = args[i + 1]
            opts[args[i]] = str(d / value) if value.endswith(".parquet") else value
        else:
            extra += args[i : i + 2]
    argv = ["ab", "--bootstrap", "0", "--no-html", *sum(opts.items(), ()), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _arm_call(i: int, arm: str, shadow: bool = False) -> ScoredCall:
    score = 0.2 + 0.6 * (i % 5) / 4 if arm == "stable" else 0.5
    return ScoredCall(
        request_id=f"q{i}",
        timestamp=1.0,
        protocol="http",
        model="lin",
        version=4 if shadow else (3 if arm == "stable" else 4),
        signature="serving_default",
        arm=arm,
        shadow=shadow,
        features=features(["u1"], [i], [0.0]),
        outputs={"score": np.array([score], np.float32), "emb": np.zeros((1, 2), np.float32)},
    )


def test_logged_arms_and_shadow_rows(tmp_path, capsys):
    logger = PredictionLogger(tmp_path / "logs", flush_s=60)
    for i in range(40):
        logger(_arm_call(i, "stable" if i % 2 else "canary"))
        if i % 2:
            logger(_arm_call(i, "stable", shadow=True))  # mirrored: never a served row
    logger.close()
    clicks = [int(i % 5 >= 3) for i in range(40)]
    pacsv.write_csv(  # CSV outcomes, one per request (no row column)
        pa.table({"request_id": [f"q{i}" for i in range(40)], "click": clicks}),
        tmp_path / "outcomes.csv",
    )
    (tmp_path / "schema.toml").write_text(LABELLED_SCHEMA)
    common = ["--data", str(tmp_path / "logs"), "--join", str(tmp_path / "outcomes.csv")]
    res = _ab(
        tmp_path, "arms", "--control", "logged:canary", "--treatment", "logged:stable", *common
    )
    assert res["populations"]["control"]["rows"] == res["populations"]["treatment"]["rows"] == 20
    auc = res["overall"]["metrics"]["auc"]
    assert (auc["control"], auc["treatment"]) == (0.5, 1.0)  # constant scores; perfect order
    assert res["data"]["shadow_included"] is False
    # with the shadow rows: v4 scored 20 served plus 20 mirrored rows
    res = _ab(
        tmp_path, "v4", "--control", "logged:v4", "--treatment", "uniform", *common,
        "--include-shadow",
    )  # fmt: skip
    assert res["rows"] == 40
    capsys.readouterr()
