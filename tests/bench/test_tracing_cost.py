"""bench.serving.tracing_cost with few calls: the JSON line and the spans each detail makes."""

from __future__ import annotations

import json

import pytest

from bench.serving.tracing_cost import main
from serving import tracing
from serving.otlp_wire import ENCODE_CHUNK_SPANS


def test_stages_make_five_spans_per_call_and_call_one(capsys):
    assert main(["--calls", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spans_per_call_stages"] == 5.0 and out["spans_per_call_call"] == 1.0
    for key in ("off_us", "sampled_stages_us", "sampled_call_us", "not_sampled_us"):
        assert out[key] > 0
    for detail in ("stages", "call"):
        ratio = out[f"sdk_{detail}_us"] / out[f"sampled_{detail}_us"]
        assert out[f"sdk_over_own_{detail}"] == pytest.approx(ratio, rel=0.05)
    assert set(out["encode_us_per_span"]) == {"wire", "sdk"}
    ratio = out["sampled_stages_us"] / out["sampled_call_us"]
    assert out["stages_over_call"] == pytest.approx(ratio, rel=0.05)
    waits = out["export_lock_wait_ms"]
    server = f"batch_{tracing.EXPORT_BATCH_SPANS}_in_{ENCODE_CHUNK_SPANS}"
    assert set(waits) == {"batch_512", "batch_64", server}
    sent = out["export_us_per_span"]
    batches = ("batch_64", f"batch_{tracing.EXPORT_BATCH_SPANS}")
    assert set(sent) == {*batches, *(f"receiver_{b}" for b in batches)}
    assert all(v > 0 for v in sent.values())
    assert all(w["max"] >= w["p99"] >= 0 for w in waits.values())
    assert not tracing.enabled()
