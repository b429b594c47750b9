"""The packaging in ``deploy/``: the Kubernetes manifests parse and validate (the Kubernetes
schemas of kubernetes-validate; KServe's resources against ``tests/deploy/kserve_schema``), the
Dockerfiles' command lines are ``stitchrec serve`` command lines, and the ports, probes, drain
and volume agree between the images, the manifests and the server's flags. ``kubectl`` and the
docker build run where they can (an API server for kubectl's discovery, a docker daemon)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pipelines.cli import build_parser
from tests.deploy.kserve_schema import SCHEMAS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
KUBE = ROOT / "deploy" / "kubernetes"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
MANIFESTS = sorted(KUBE.glob("*.yaml"))
K8S_VERSION = "1.32"
#: the HTTP front door's flags (serving/http); a build without it has no such serve flags
HTTP_FLAGS = ("--http-port", "--http-host")
PORTS = {"grpc": 8500, "http": 8080, "probe": 8081, "metrics": 9090}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _by_kind(kind: str) -> dict:
    found = [d for p in MANIFESTS for d in _docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} in {MANIFESTS}"
    return found[0]


def _serve_flags() -> set[str]:
    """The option strings ``stitchrec serve --help`` lists."""
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["serve"]
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", sub.format_help()))


def _serve(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    """``argv`` parsed by the serve parser, and its raw ``--flag value`` pairs. Every flag must
    be a serve flag; the HTTP flags are left out of the parse where this build lacks them."""
    raw = dict(zip(argv[::2], argv[1::2], strict=True))
    assert all(k.startswith("--") for k in raw), argv
    unknown = set(raw) - _serve_flags()
    assert unknown <= set(HTTP_FLAGS), f"not stitchrec serve flags: {sorted(unknown)}"
    kept = [x for k, v in raw.items() if k not in unknown for x in (k, v)]
    return build_parser().parse_args(["serve", *kept]), raw


def _dockerfile(path: Path) -> dict:
    """ENTRYPOINT, CMD (JSON forms), EXPOSE ports, VOLUME and HEALTHCHECK of a Dockerfile."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # join continued lines
    out: dict = {"expose": set(), "volume": []}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENTRYPOINT":
            out["entrypoint"] = json.loads(rest)
        elif word == "CMD":
            out["cmd"] = json.loads(rest)
        elif word == "EXPOSE":
            out["expose"] |= {int(p.split("/")[0]) for p in rest.split()}
        elif word == "VOLUME":
            out["volume"] += json.loads(rest)
        elif word == "HEALTHCHECK":
            out["healthcheck"] = rest
        elif word == "USER":
            out["user"] = rest
    return out


def _ports(args: argparse.Namespace, raw: dict[str, str]) -> dict[str, int]:
    return {
        "grpc": args.port,
        "http": int(raw["--http-port"]),
        "probe": args.probe_port,
        "metrics": args.metrics_port,
    }


def test_manifests_parse_and_validate():
    kinds = []
    for path in MANIFESTS:
        for doc in _docs(path):
            kinds.append(doc["kind"])
            if doc["kind"] in SCHEMAS:
                jsonschema.validate(doc, SCHEMAS[doc["kind"]])
                # the runtime's containers are Kubernetes containers: checked as a pod's
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "runtime"},
                    "spec": {"containers": doc["spec"].get("containers", [])},
                }
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
            else:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert sorted(kinds) == ["Deployment", "InferenceService", "Service", "ServingRuntime"]


def test_validation_catches_a_wrong_field():
    deployment = _by_kind("Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    runtime = _by_kind("ServingRuntime")
    bad = {**runtime, "spec": {**runtime["spec"], "protocolVersions": ["v3"]}}
    with pytest.raises(jsonschema.ValidationError, match="'v3' is not one of"):
        jsonschema.validate(bad, SCHEMAS["ServingRuntime"])


def test_kubectl_client_dry_run(tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    # an explicit, unreachable API server: the test never talks to the user's cluster
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: "
        "'https://127.0.0.1:1'}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]"
        "\ncurrent-context: none\nusers: [{name: none, user: {token: none}}]\n"
    )
    files = [x for p in MANIFESTS for x in ("-f", str(p))]
    cmd = ["kubectl", "--kubeconfig", str(config), "--request-timeout", "5s", "apply"]
    p = subprocess.run(
        [*cmd, "--dry-run=client", "--validate=false", *files],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if p.returncode != 0 and re.search(
        r"connection refused|unable to recognize|dial tcp", p.stderr
    ):
        pytest.skip(
            "kubectl apply --dry-run=client needs an API server for resource discovery (none here)"
        )
    assert p.returncode == 0, p.stderr
    assert "stitchrec-serving" in p.stdout


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_stitchrec_serve_on_the_documented_ports(path):
    d = _dockerfile(path)
    assert d["entrypoint"] == ["stitchrec", "serve"]
    assert d.get("user") not in (None, "root", "0", "0:0")
    args, raw = _serve(d["cmd"])
    assert args.repo == "/models" and "/models" in d["volume"]
    assert _ports(args, raw) == PORTS
    assert d["expose"] == set(PORTS.values())
    assert args.host == raw["--http-host"] == args.metrics_host == "0.0.0.0"
    url = urlparse(re.search(r"http://[^'\" ]+", d["healthcheck"]).group(0))
    assert (url.port, url.path) == (PORTS["probe"], "/v2/health/live")


def test_http_flags_are_serve_flags():
    missing = [f for f in HTTP_FLAGS if f not in _serve_flags()]
    if missing:
        pytest.skip(f"stitchrec serve in this build has no {', '.join(missing)} (serving/http)")
    for path in DOCKERFILES:
        args, _raw = _serve(_dockerfile(path)["cmd"])
        assert (args.http_port, args.http_host) == (PORTS["http"], "0.0.0.0")


def test_deployment_agrees_with_the_image_and_the_server():
    deployment, service = _by_kind("Deployment"), _by_kind("Service")
    pod = deployment["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args, raw = _serve(c["args"])
    assert c["args"] == _dockerfile(DOCKER / "Dockerfile")["cmd"]  # the image's defaults
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named == PORTS == _ports(args, raw)

    def probe(kind: str) -> tuple[str, int]:
        get = c[kind]["httpGet"]
        return get["path"], named.get(get["port"], get["port"])

    # the probe port: answered from the heartbeat, never held up by a busy server
    assert probe("livenessProbe") == ("/v2/health/live", PORTS["probe"])
    assert probe("readinessProbe") == ("/v2/health/ready", PORTS["probe"])
    assert probe("startupProbe")[1] == PORTS["probe"]
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 120  # room to load models
    # stop: preStop sleep = the server's drain; the pod's grace covers sleep + drain + grace
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and float(sleep[1]) == args.drain_seconds
    total = float(sleep[1]) + args.drain_seconds + args.grace_seconds
    assert pod["spec"]["terminationGracePeriodSeconds"] > total
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert mounts["models"] == args.repo and "models" in volumes

    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    # clients' ports; the kubelet probes the pod itself
    assert ports == {name: (port, name) for name, port in PORTS.items() if name != "probe"}
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == PORTS["metrics"]
    assert notes["prometheus.io/path"] == "/metrics"


def test_kserve_runtime_serves_v2_on_http_and_grpc():
    runtime, isvc = _by_kind("ServingRuntime"), _by_kind("InferenceService")
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"
    args, raw = _serve(c["args"])
    assert args.repo == "/mnt/models"  # where KServe's storage initializer puts storageUri
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http1": int(raw["--http-port"]), "h2c": args.port}
    assert c["ports"][0]["name"] == "http1"  # Knative routes the first port
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]


def _docker_daemon() -> str | None:
    """None where a docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    try:
        p = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "docker info did not answer in 20 s"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no docker daemon answers docker info: {last}"
    return None


@pytest.mark.slow
def test_docker_build_cpu_image():
    why = _docker_daemon()
    if why:
        pytest.skip(why)
    tag = "stitchrec-serving:test"
    cmd = ["docker", "build", "-f", str(DOCKER / "Dockerfile"), "-t", tag, str(ROOT)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    p = subprocess.run(
        ["docker", "run", "--rm", tag, "--help"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and "--repo" in p.stdout, p.stderr[-4000:]
