"""The data cluster recipe in ``deploy/kubernetes/data``: the manifests validate against the
Kubernetes schemas, the Job's command is a ``stitchrec`` command line naming the scheduler's
Service, the workers join that scheduler, and the Job and the workers share the data volume at
the paths the command reads and writes."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from pipelines.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "deploy" / "kubernetes" / "data"
K8S_VERSION = "1.32"


def _docs() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(DATA.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _mounts(doc: dict) -> dict[str, str]:
    """``{claim name: mount path}`` of a pod template's first container."""
    spec = doc["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}
    return {claims[m["name"]]: m["mountPath"] for m in _container(doc)["volumeMounts"]}


def test_the_data_manifests_validate():
    docs = _docs()
    assert sorted(docs) == [
        ("Deployment", "dask-scheduler"),
        ("Deployment", "dask-worker"),
        ("Job", "stitchrec-convert"),
        ("PersistentVolumeClaim", "stitchrec-data"),
        ("Service", "dask-scheduler"),
    ]
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert docs[("PersistentVolumeClaim", "stitchrec-data")]["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]


def test_the_job_and_the_workers_use_the_scheduler_and_the_shared_volume():
    docs = _docs()
    service = docs[("Service", "dask-scheduler")]
    comm = next(p for p in service["spec"]["ports"] if p["name"] == "comm")
    address = f"tcp://{service['metadata']['name']}:{comm['port']}"
    scheduler = _container(docs[("Deployment", "dask-scheduler")])
    assert scheduler["command"] == ["dask", "scheduler"]
    assert scheduler["args"][scheduler["args"].index("--port") + 1] == str(comm["port"])
    worker = _container(docs[("Deployment", "dask-worker")])
    assert worker["command"] == ["dask", "worker"] and worker["args"][0] == address
    job = docs[("Job", "stitchrec-convert")]
    command = _container(job)["command"] + _container(job)["args"]
    assert command[0] == "stitchrec"
    args = build_parser().parse_args(command[1:])
    assert args.cluster == address and args.handler == "pipelines.data_commands:cmd_convert"
    shared = _mounts(job)["stitchrec-data"]
    assert _mounts(docs[("Deployment", "dask-worker")])["stitchrec-data"] == shared
    assert all(p.startswith(shared + "/") for p in [*args.input, args.output])
    images = {_container(d)["image"] for k, d in docs.items() if k[0] in ("Deployment", "Job")}
    dockerfile = (ROOT / "deploy" / "docker" / "data" / "Dockerfile").read_text()
    assert images == {"stitchrec-data:0.1.0"} and "-t stitchrec-data:0.1.0" in dockerfile
    assert "pip install '.[scale]'" in dockerfile
