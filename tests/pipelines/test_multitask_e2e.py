"""One tiny ESMM model over behaviour sequences, end to end: trained by ``pipelines.train``
(per-task test metrics in its report), exported, served over KServe ModelInfer, TF Serving
Predict and RankingService Rank (the SavedModel's scores on every protocol and every task),
evaluated and compared by the ``stitchrec evaluate --task`` / ``ab --task`` commands, and fed
bad input: a history far longer than ``max_len``, an empty history, bad task labels."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from features.dataset import iter_batches
from features.schema import load_schema
from features.synthetic import write_dataset
from features.synthetic_config import SyntheticConfig
from pipelines.cli import main
from pipelines.config import load_config
from pipelines.export import export_run
from pipelines.train import train
from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from ranking import metrics
from serving.client import RankingClient
from serving.inference import Limits
from serving.server import ServerOptions
from serving.testing import ServerThread

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("click", "buy")
USER = ("hist_items", "hist_cats")  # the schema's `user` group
MAX_LEN = 6

CONFIG = """output_dir = "{root}/run"
[data]
schema = "{root}/data/schema.toml"
train = ["{train}"]
test = ["{root}/data/test"]
validation_fraction = 0.0
[model]
type = "dnn"
embedding_dim = 4
mlp = [8]
sequence_pooling = "din"
sequence_options = {{hidden = [8]}}
multitask = "esmm"
tasks = [{{name = "click", label = "label"}}, {{name = "buy", label = "buy", defined_on = "click"}}]
tower_mlp = [4]
[train]
epochs = 1
batch_size = 256
"""


def _config(root: Path, name: str, train_path: Path) -> Path:
    path = root / f"{name}.toml"
    text = CONFIG.format(root=root, train=train_path)
    path.write_text(text.replace(f"{root}/run", f"{root}/{name}"))
    return path


def _cli(*argv: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pipelines.cli", *argv]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    synthetic = SyntheticConfig(
        rows=3000,
        num_numeric=2,
        num_categorical=4,
        vocab_sizes=50,
        n_single=1,
        n_pairs=1,
        n_triples=0,
        sequences=True,
        conversion=True,
        hist_max_len=MAX_LEN,
        seed=3,
    )
    write_dataset(synthetic, root / "data")
    lines: list[str] = []
    report = train(load_config(_config(root, "run", root / "data" / "train")), log=lines.append)
    export = export_run(root / "run")
    shutil.copytree(export, root / "repo" / "esmm" / "1")
    # the two commands run in their own processes while the module's other tests run
    test_data = str(root / "data" / "test")
    evaluate = ["evaluate", "--model", str(export), "--data", test_data]
    ab = ["ab", "--control", "uniform", "--treatment", str(export), "--data", test_data]
    ab += ["--task", "buy", "--task", "click", "--bootstrap", "100", "--output", str(root / "ab")]
    procs = {
        "evaluate": _cli(*evaluate, "--task", "buy", "--task", "click"),
        "unknown": _cli(*evaluate, "--task", "buy", "--task", "nope"),
        "ab": _cli(*ab),
    }
    schema = load_schema(root / "data" / "schema.toml")
    files = sorted((root / "data" / "test").glob("*.parquet"))
    test = next(iter_batches(schema, files, batch_size=100_000, shuffle=False))  # cells filled
    test = {k: v.tolist() for k, v in test.items()}
    yield {
        "root": root,
        "report": report,
        "lines": lines,
        "export": export,
        "model": tf.saved_model.load(str(export)).signatures["serving_default"],
        "test": test,
        "procs": procs,
    }
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.communicate()


def _features(test: dict, rows: slice) -> dict[str, list]:
    return {k: v[rows] for k, v in test.items() if k not in ("label", "buy")}


def _saved(run, features: dict[str, list]) -> dict[str, np.ndarray]:
    spec = run["model"].structured_input_signature[1]
    out = run["model"](**{k: tf.constant(features[k], spec[k].dtype) for k in spec})
    return {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def server(run):
    opts = ServerOptions(
        policy="all",
        metrics_port=0,
        max_message_bytes=16 * 1024 * 1024,
        limits=Limits(max_string_bytes=4 * 1024 * 1024),
    )
    with ServerThread(run["root"] / "repo", opts) as s:
        yield s


def test_training_reports_every_task(run):
    report, lines = run["report"], run["lines"]
    tasks = report["test_tasks"]
    assert list(tasks) == list(TASKS)
    # the primary task's figures are the single-task test line's
    assert tasks["click"]["auc"] == pytest.approx(report["test"]["auc"], abs=1e-9)
    assert tasks["click"]["rows"] == report["test"]["rows"] == tasks["buy"]["rows"]
    given = tasks["buy"]["given_label"]
    assert given["rows"] == tasks["click"]["positives"]
    assert given["positives"] == tasks["buy"]["positives"]
    saved = json.loads((run["root"] / "run" / "train_report.json").read_text())
    assert saved["test_tasks"] == json.loads(json.dumps(tasks))
    assert any(
        line.startswith("test task buy: auc ") and "given label: auc" in line for line in lines
    )
    # recomputed from the SavedModel over the test rows
    test = run["test"]
    scores = _saved(run, _features(test, slice(None)))
    y_click, y_buy = np.array(test["label"]), np.array(test["buy"])
    assert tasks["buy"]["auc"] == pytest.approx(metrics.auc(y_buy, scores["score_buy"]), abs=1e-6)
    on = y_click == 1
    want = metrics.auc(y_buy[on], scores["score_buy_given_click"][on])
    assert given["auc"] == pytest.approx(want, abs=1e-6)


def _bytes_raw(values: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)


def test_kserve_predict_and_rank_serve_the_saved_model_scores(run, server):
    rows = slice(0, 5)
    features = _features(run["test"], rows)
    want = _saved(run, features)
    n = len(features["item"])
    channel = grpc.insecure_channel(server.target)

    # KServe v2 ModelInfer: every signature output
    req = kserve_pb2.ModelInferRequest(model_name="esmm")
    for name, values in features.items():
        if isinstance(values[0], str):
            req.inputs.add(name=name, datatype="BYTES", shape=[n])
            req.raw_input_contents.append(_bytes_raw(values))
        else:
            req.inputs.add(name=name, datatype="FP32", shape=[n])
            req.raw_input_contents.append(np.array(values, "<f4").tobytes())
    resp = kserve_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
    got = {
        o.name: np.frombuffer(raw, "<f4")
        for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)
    }
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-6, err_msg=k)

    # TF Serving Predict
    preq = predict_pb2.PredictRequest()
    preq.model_spec.name = "esmm"
    for name, values in features.items():
        dtype = object if isinstance(values[0], str) else np.float32
        preq.inputs[name].CopyFrom(tf.make_tensor_proto(np.array(values, dtype=dtype)))
    presp = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(preq, timeout=30)
    assert set(presp.outputs) == set(want)
    for k in want:
        np.testing.assert_allclose(tf.make_ndarray(presp.outputs[k]), want[k], atol=1e-6)

    # Rank: one user (row 0's history, sent once) and the candidates of rows 0..4
    user = {k: features[k][0] for k in USER}
    cands = {k: v for k, v in features.items() if k not in USER}
    ranked = _saved(run, {**cands, **{k: [user[k]] * n for k in USER}})
    with RankingClient(server.target) as c:
        r = c.rank("esmm", user, cands)
    # every score_* output: each task's joint score and buy's score given a click
    assert set(r.tasks) == {*TASKS, "buy_given_click"}
    np.testing.assert_allclose(r.scores, ranked["score"], atol=1e-6)
    for t in r.tasks:
        np.testing.assert_allclose(r.tasks[t], ranked[f"score_{t}"], atol=1e-6)
    np.testing.assert_allclose(r.tasks["click"], r.scores, atol=0)


def test_a_huge_and_an_empty_history_are_answered(run, server):
    features = _features(run["test"], slice(0, 5))
    cands = {k: v for k, v in features.items() if k not in USER}
    first = run["test"]["item"][10 : 10 + MAX_LEN]  # items of the vocabulary, newest first
    cats = run["test"]["item_cat"][10 : 10 + MAX_LEN]
    huge = 200_000
    long_user = {
        "hist_items": "|".join(first + ["izzzzzzzz"] * (huge - MAX_LEN)),
        "hist_cats": "|".join(cats + ["k9"] * (huge - MAX_LEN)),
    }
    short_user = {"hist_items": "|".join(first), "hist_cats": "|".join(cats)}
    with RankingClient(server.target) as c:
        long_r = c.rank("esmm", long_user, cands)
        short_r = c.rank("esmm", short_user, cands)
        empty_r = c.rank("esmm", {"hist_items": "", "hist_cats": ""}, cands)
    # truncated to the newest max_len items: the score of those items alone
    for t in long_r.tasks:
        np.testing.assert_allclose(long_r.tasks[t], short_r.tasks[t], atol=1e-6)
    # ... and the history counts: without it the scores differ
    diff = [np.abs(short_r.tasks[t] - empty_r.tasks[t]).max() for t in short_r.tasks]
    assert max(diff) > 1e-5
    want = _saved(run, {**cands, **{k: [""] * 5 for k in USER}})
    np.testing.assert_allclose(empty_r.scores, want["score"], atol=1e-6)
    for t in TASKS:
        np.testing.assert_allclose(empty_r.tasks[t], want[f"score_{t}"], atol=1e-6)


def test_evaluate_command_prints_every_task(run):
    rc, out, err = _finish(run["procs"]["evaluate"])
    assert rc == 0, err[-3000:]
    result = json.loads(out)
    assert list(result["tasks"]) == ["buy", "click"]  # the tasks asked for, in that order
    for t in TASKS:
        assert result["tasks"][t]["auc"] == pytest.approx(run["report"]["test_tasks"][t]["auc"])
    assert result["tasks"]["buy"]["given_label"]["rows"] == result["tasks"]["click"]["positives"]


def test_an_unknown_task_is_one_error_line_and_status_2(run):
    rc, out, err = _finish(run["procs"]["unknown"])
    assert rc == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert lines == [
        "error: --task nope: the model has no such task; its tasks: ['buy', 'click']"
    ], err[-2000:]


def test_ab_command_compares_every_task_given(run):
    rc, out, err = _finish(run["procs"]["ab"])
    assert rc == 0, err[-3000:]
    res = json.loads((run["root"] / "ab" / "ab.json").read_text())
    assert list(res["tasks"]) == ["buy", "click"]
    for t in TASKS:
        assert f"  {t} " in out.split("tasks (")[1]
        assert res["tasks"][t]["overall"]["metrics"]["auc"]["treatment"] == pytest.approx(
            run["report"]["test_tasks"][t]["auc"], abs=1e-6
        )


def test_ab_with_an_unknown_task_is_one_error_line(run, capsys):
    data, model = str(run["root"] / "data" / "test"), str(run["export"])
    argv = ["ab", "--control", "uniform", "--treatment", model, "--data", data]
    assert main([*argv, "--task", "nope", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "nope" in err[0] and "click" in err[0] and "buy" in err[0]


@pytest.mark.parametrize(
    ("label", "buy", "message"),
    [
        (1.0, 2.0, "row 8, column 'buy': value 2.0, expected 0 or 1"),
        (None, 0.0, "row 8, column 'label': value None, expected 0 or 1"),
        (1.0, None, "row 8, column 'buy': value None, expected 0 or 1, missing only where 'label'"),
        (1.0, "drop", "lacks columns ['buy'] that schema 'synthetic' needs"),
    ],
    ids=["label of 2", "missing primary label", "missing label of a positive parent", "no column"],
)
def test_bad_task_labels_stop_training_with_one_error_line(run, capsys, label, buy, message):
    root = run["root"]
    table = pq.read_table(sorted((root / "data" / "train").glob("*.parquet"))[0]).slice(0, 50)
    cols = table.to_pydict()
    cols["label"][7] = label
    if buy == "drop":
        del cols["buy"]
    else:
        cols["buy"][7] = buy
    schema = pa.schema(
        [
            pa.field(n, pa.float32()) if n in ("label", "buy") else f
            for n, f in zip(table.schema.names, table.schema, strict=True)
            if n in cols
        ]
    )
    bad = root / f"bad_{label}_{buy}" / "part-00000.parquet"
    bad.parent.mkdir()
    pq.write_table(pa.table(cols, schema=schema), bad)
    assert main(["train", "--config", str(_config(root, bad.parent.name, bad.parent))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert str(bad) in err[0] and message in err[0]  # the file, row and field
