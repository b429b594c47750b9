"""bench.continuous_chain's kill plan (by hand) and op listing (a stock SavedModel); the bench
itself runs with ``python -m bench.continuous_chain``."""

from __future__ import annotations

from bench.continuous_chain import PHASES, STATES, plan_kills
from bench.continuous_chain_models import op_types, unknown_ops
from serving.testing import write_linear_model

# two uninterrupted days: phase start times (s) and durations
TIMING = [
    {"seconds": 40.0, "entered": {"training": 0.0, "export": 30.0, "scoring": 34.0,
                                  "publishing": 38.0, "finished": 39.0}},
    {"seconds": 50.0, "entered": {"training": 0.0, "export": 35.0, "scoring": 41.0,
                                  "publishing": 47.0, "finished": 48.5}},
]  # fmt: skip


def test_kills_cover_every_day_and_phase_inside_the_phase_spans():
    plan = plan_kills(TIMING, kills=5, seed=3)
    assert sorted(k["day"] for k in plan).count(0) in (2, 3) and {k["day"] for k in plan} == {0, 1}
    assert set(PHASES) <= {k["phase"] for k in plan}
    for k in plan:
        entered, end = TIMING[k["day"]]["entered"], TIMING[k["day"]]["seconds"]
        stop = entered.get(STATES[STATES.index(k["phase"]) + 1], end)
        assert k["phase_start"] == entered[k["phase"]] <= k["t"] <= stop
    # per day in phase order, and the same seed gives the same plan
    assert plan == sorted(plan, key=lambda k: (k["day"], PHASES.index(k["phase"]), k["t"]))
    assert plan_kills(TIMING, kills=5, seed=3) == plan


def test_a_stock_savedmodel_has_no_ops_outside_tf_raw_ops(tmp_path):
    model = write_linear_model(tmp_path / "1", bias=0.5)
    ops = op_types(model)
    assert {"Sigmoid", "StatefulPartitionedCall"} <= ops, sorted(ops)
    assert unknown_ops(model) == []
