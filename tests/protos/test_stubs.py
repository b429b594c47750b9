"""The committed protobuf modules are what grpcio-tools generates from the ``.proto`` files (the
generator's version stamps aside: a newer grpcio-tools writes the same code with its own
version), the grpcio they require is what pyproject.toml asks for, and importing ``protos``
writes nothing (regenerate with ``make protos``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import protos

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"


# the lines where generated code names the versions of grpcio-tools and protobuf that wrote it
VERSION_STAMPS = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = ''"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version:"),
    (
        re.compile(r"(ValidateProtobufRuntimeVersion\(\n\s*[\w.]+,)\n\s*\d+,\n\s*\d+,\n\s*\d+,"),
        r"\1",
    ),
)


def _unstamped(code: str) -> str:
    for pattern, replacement in VERSION_STAMPS:
        code = pattern.sub(replacement, code)
    return code


def _generated(proto: str) -> list[str]:
    stem = proto.removesuffix(".proto")
    return [f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"]


def test_committed_modules_equal_freshly_generated(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (a dev dependency) is not installed")
    for proto in protos.PROTO_FILES:
        # protoc in its own process: its bundled protobuf runtime and TensorFlow's (loaded by
        # other tests in this process) must not meet
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{ROOT}",
                f"--python_out={tmp_path}",
                f"--grpc_python_out={tmp_path}",
                f"protos/{proto}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, f"protoc failed on protos/{proto}: {p.stderr[-2000:]}"
        for name in _generated(proto):
            fresh = _unstamped((tmp_path / "protos" / name).read_text())
            assert fresh == _unstamped((PROTOS / name).read_text()), (
                f"protos/{name} differs from what protos/{proto} generates; run `make protos`"
            )


def test_version_stamps_are_the_only_lines_left_out() -> None:
    code = (PROTOS / "ranking_service_pb2.py").read_text()
    assert _unstamped(code) != code
    assert "ValidateProtobufRuntimeVersion(\n    _runtime_version.Domain.PUBLIC,\n    '',\n" in (
        _unstamped(code)
    )
    edited = code.replace("RankRequest", "RankQuery")
    assert _unstamped(edited) != _unstamped(code)


def test_the_required_grpcio_is_at_least_the_generated_version() -> None:
    """The stubs refuse to import under a grpcio older than the grpcio-tools that wrote them."""
    (generated,) = re.findall(
        r"^GRPC_GENERATED_VERSION = '([^']*)'$",
        (PROTOS / "ranking_service_pb2_grpc.py").read_text(),
        re.M,
    )
    (required,) = re.findall(r'"grpcio>=([\d.]+),', (ROOT / "pyproject.toml").read_text())

    def parts(version: str) -> tuple[int, ...]:
        return tuple(int(x) for x in version.split("."))

    assert parts(required) >= parts(generated), (required, generated)


def test_every_proto_has_committed_modules() -> None:
    on_disk = sorted(p.name for p in PROTOS.glob("*.proto"))
    assert on_disk == sorted(protos.PROTO_FILES)
    for proto in protos.PROTO_FILES:
        for name in _generated(proto):
            assert (PROTOS / name).is_file(), f"protos/{name} is missing; run `make protos`"


def _listing(d: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(d.iterdir())}


def test_import_writes_nothing_in_a_read_only_package(tmp_path: Path) -> None:
    pkg = tmp_path / "protos"
    shutil.copytree(PROTOS, pkg, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    for proto in protos.PROTO_FILES:  # sources newer than their modules: nothing regenerates
        os.utime(pkg / proto)
    before = _listing(pkg)
    mode = pkg.stat().st_mode
    pkg.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        code = (
            "import protos\n"
            "from protos import grpc_service_pb2, grpc_service_pb2_grpc\n"
            "from protos import ranking_service_pb2, ranking_service_pb2_grpc\n"
            f"assert protos.__file__.startswith({str(pkg)!r}), protos.__file__\n"
            "print(ranking_service_pb2.DESCRIPTOR.services_by_name['RankingService'].full_name)\n"
        )
        p = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        pkg.chmod(mode)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "stitchrec.serving.RankingService"
    assert _listing(pkg) == before
