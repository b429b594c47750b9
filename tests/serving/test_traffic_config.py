"""traffic.toml parsing (every error names the file, the key and the value), the table that
re-reads changed files and keeps the last good config, and the split's arithmetic."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest

from pipelines.config import ConfigError
from serving.routing import BUCKETS, arm_of, bucket, key_bytes
from serving.traffic import (
    Shadow,
    Split,
    TrafficConfig,
    TrafficError,
    TrafficTable,
    load_traffic,
    parse_traffic,
)

EXAMPLE = """
[labels]
stable = 3
canary = 4

[split]
key = "user"
weights = { stable = 90, canary = 10 }

[shadow]
label = "canary"
fraction = 0.1
queue = 64
max_share = 0.2
"""


def write(path: Path, text: str) -> None:
    """Replaces ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_example_parses():
    config = parse_traffic(EXAMPLE, "m/traffic.toml")
    assert config == TrafficConfig(
        {"stable": 3, "canary": 4},
        Split("user", (("stable", 90.0), ("canary", 10.0))),
        Shadow(None, "canary", 0.1, 64, 0.2),
    )
    assert config.shadow_version() == 4
    assert config.split.feature == "user" and config.split.header is None


def test_defaults_and_header_key():
    config = parse_traffic(
        '[labels]\na = 1\n[split]\nkey = "header:X-User"\nweights = { a = 1 }\n'
        "[shadow]\nversion = 2\n"
    )
    assert config.split.header == "x-user" and config.split.feature is None
    assert config.shadow == Shadow(2, None, 1.0, 64, 0.05)
    assert config.shadow_version() == 2
    assert parse_traffic("") == TrafficConfig()
    assert parse_traffic("[labels]\nv1 = 1\n").labels == {"v1": 1}


LABELS = "[labels]\nstable = 1\ncanary = 2\n"


@pytest.mark.parametrize(
    "text,message",
    [
        ("[labels\n", "not valid TOML"),
        ("[labelz]\na = 1\n", "top level: unknown key(s) ['labelz']"),
        ("labels = 3\n", "labels is 3; expected a table [labels]"),
        ("[labels]\nstable = 0\n", "labels.stable is 0; expected a version number"),
        ('[labels]\nstable = "3"\n', "labels.stable is '3'; expected a version number"),
        ("[labels]\nstable = true\n", "labels.stable is True; expected a version number"),
        ("[labels]\nstable = 1.5\n", "labels.stable is 1.5; expected a version number"),
        ('[labels]\n"9x" = 1\n', "label '9x' is not a valid label"),
        ('[labels]\n"a b" = 1\n', "label 'a b' is not a valid label"),
        (LABELS + "[split]\nweights = { stable = 1 }\n", "split.key is None"),
        (LABELS + '[split]\nkey = ""\nweights = { stable = 1 }\n', "split.key is ''"),
        (LABELS + '[split]\nkey = "header:"\nweights = { stable = 1 }\n', "split.key is"),
        (LABELS + '[split]\nkey = "user"\n', "split.weights is None; expected a table"),
        (LABELS + '[split]\nkey = "user"\nweights = {}\n', "split.weights is {}"),
        (LABELS + '[split]\nkey = "user"\nweights = 5\n', "split.weights is 5"),
        (
            LABELS + '[split]\nkey = "user"\nweights = { beta = 1 }\n',
            "split.weights.beta: 'beta' is not a label of [labels]; labels: ['canary', 'stable']",
        ),
        (
            LABELS + '[split]\nkey = "user"\nweights = { stable = -1 }\n',
            "split.weights.stable is -1; expected a number >= 0",
        ),
        (
            LABELS + '[split]\nkey = "user"\nweights = { stable = "x" }\n',
            "split.weights.stable is 'x'; expected a number >= 0",
        ),
        (
            LABELS + '[split]\nkey = "user"\nweights = { stable = 0, canary = 0 }\n',
            "the weights sum to 0",
        ),
        (
            LABELS + '[split]\nkey = "user"\nweights = { stable = 1 }\nseed = 3\n',
            "[split]: unknown key(s) ['seed']",
        ),
        (LABELS + "[shadow]\nfraction = 0.5\n", "expected exactly one of label and version"),
        (
            LABELS + '[shadow]\nlabel = "canary"\nversion = 2\n',
            "expected exactly one of label and version",
        ),
        (LABELS + '[shadow]\nlabel = "beta"\n', "shadow.label: 'beta' is not a label"),
        (LABELS + "[shadow]\nversion = 0\n", "shadow.version is 0; expected a version number"),
        (LABELS + "[shadow]\nversion = 2\nfraction = 0\n", "shadow.fraction is 0; expected"),
        (LABELS + "[shadow]\nversion = 2\nmax_share = 0\n", "shadow.max_share is 0; expected"),
        (LABELS + "[shadow]\nversion = 2\nmax_share = 1.5\n", "shadow.max_share is 1.5"),
        (LABELS + "[shadow]\nversion = 2\nfraction = 1.5\n", "shadow.fraction is 1.5"),
        (LABELS + '[shadow]\nversion = 2\nfraction = "all"\n', "shadow.fraction is 'all'"),
        (LABELS + "[shadow]\nversion = 2\nfraction = nan\n", "shadow.fraction is nan"),
        (LABELS + "[shadow]\nversion = 2\nqueue = 0\n", "shadow.queue is 0; expected an integer"),
        (LABELS + "[shadow]\nversion = 2\nqueue = 2.5\n", "shadow.queue is 2.5"),
        (LABELS + "[shadow]\nversion = 2\nrate = 1\n", "[shadow]: unknown key(s) ['rate']"),
    ],
)
def test_bad_files_name_file_key_and_value(tmp_path, text, message):
    path = tmp_path / "traffic.toml"
    path.write_text(text)
    with pytest.raises(TrafficError) as err:
        load_traffic(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)
    assert isinstance(err.value, ConfigError)


def test_unreadable_file(tmp_path):
    path = tmp_path / "traffic.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(TrafficError, match="cannot be read"):
        load_traffic(path)


def test_table_rereads_changes_and_keeps_the_last_good_config(tmp_path):
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "traffic.toml"
    errors: list[str] = []
    table = TrafficTable(tmp_path, check_interval_s=3600, on_error=errors.append)
    assert table.config("m") is None  # no file: no routing
    write(path, "[labels]\nstable = 1\n")
    assert table.config("m") is None  # looked at less than check_interval_s ago
    table.refresh(["m"])
    assert table.config("m").labels == {"stable": 1}

    write(path, "[labels]\nstable = 0\n")
    table.refresh(["m"])
    table.refresh(["m"])  # the same bad file: reported once
    assert table.config("m").labels == {"stable": 1}
    assert errors == ["m"] and "labels.stable is 0" in table.errors["m"]

    write(path, "[labels]\nstable = 2\n")
    table.refresh(["m"])
    assert table.config("m").labels == {"stable": 2} and "m" not in table.errors

    path.unlink()
    table.refresh(["m"])
    assert table.config("m") is None


def test_table_checks_on_request_at_most_every_interval(tmp_path):
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "traffic.toml"
    table = TrafficTable(tmp_path, check_interval_s=0.0)
    write(path, "[labels]\na = 1\n")
    assert table.config("m").labels == {"a": 1}
    write(path, "[labels]\na = 2\n")
    assert table.config("m").labels == {"a": 2}


def test_split_lands_within_three_standard_errors_and_is_sticky():
    split = Split("user", (("stable", 90.0), ("canary", 10.0)))
    n = 10_000
    arms = [arm_of(split, key_bytes(f"user-{i}")) for i in range(n)]
    canary = arms.count("canary")
    se = math.sqrt(n * 0.1 * 0.9)
    assert abs(canary - 0.1 * n) <= 3 * se, canary
    assert arms == [arm_of(split, key_bytes(f"user-{i}")) for i in range(n)]


def test_bucket_and_cumulative_weights_by_hand():
    # the documented formula: blake2b (8 bytes, big-endian) modulo 10,000
    digest = hashlib.blake2b(b"u1", digest_size=8).digest()
    assert bucket(b"u1") == int.from_bytes(digest, "big") % BUCKETS
    b = bucket(b"u1")
    below = Split("k", (("a", b + 1), ("b", BUCKETS - b - 1)))  # a takes buckets [0, b]
    above = Split("k", (("a", b), ("b", BUCKETS - b)))  # a takes buckets [0, b)
    assert arm_of(below, b"u1") == "a" and arm_of(above, b"u1") == "b"
    assert arm_of(Split("k", (("a", 0.0), ("b", 1.0))), b"u1") == "b"


def test_key_bytes_agree_across_types():
    assert key_bytes(42) == key_bytes("42") == key_bytes(b"42") == key_bytes(42.0) == b"42"
    assert key_bytes("é") == "é".encode()
    assert key_bytes(np.int64(7)) == b"7" and key_bytes(np.array([b"u"], object)[0]) == b"u"
    assert key_bytes(0.5) == b"0.5"
