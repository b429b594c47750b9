"""The interaction screen added to a FIVES ranking: screened crosses measured on held-out rows
and re-ranked with FIVES's active ones by their pure-interaction effect.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from features.crosses import interaction_screen as isc
from features.crosses.fives_config import FivesConfig, Log
from features.tasks import TaskRunner


def screen_and_rank(
    ranked: list[tuple[tuple[str, ...], float, bool]],
    orders: Sequence[int],
    config: FivesConfig,
    fields: Sequence[str],
    train: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray],
    log: Log = print,
    runner: TaskRunner | None = None,
) -> tuple[
    list[tuple[tuple[str, ...], float, bool]],
    dict[frozenset[str], tuple[str, float | None]],
    dict[str, Any],
]:
    """Adds the interaction screen's significant crosses to a FIVES ranking and re-ranks.

    The screen (``features.crosses.interaction_screen``) tests every field set of each of ``orders``
    on the training rows (tasks on ``runner``). FIVES's active crosses and the screen's significant ones are
    measured on the validation rows (the pure-interaction effect, eta^2, cross-fitted against
    the training rows: one scale for every order); a screened cross whose effect does not
    recur there (<= 0) is not selected. The selected crosses come first, largest effect
    first; FIVES's other crosses follow in its order. Returns the new ranking,
    ``{field set: (source, effect)}`` and a report.
    """
    t0 = time.time()
    x_tr, y_tr = train
    if config.screen_rows and config.screen_rows < len(x_tr):
        x_tr, y_tr = x_tr[: config.screen_rows], y_tr[: config.screen_rows]
    significant, caps, report = _screen_orders((x_tr, y_tr), orders, config, fields, log, runner)
    fives_active = {frozenset(f): f for f, st, active in ranked if active}
    screened = {frozenset(f): f for f in significant}
    candidates = list(fives_active) + [k for k in screened if k not in fives_active]
    for k in candidates:  # active FIVES crosses of an order the screen did not fit caps for
        if len(k) not in caps:
            caps[len(k)] = isc.fit_caps(x_tr, isc.levels_for(len(k), config.screen_max_cells))
    names = [fives_active.get(k) or screened[k] for k in candidates]
    measured = isc.held_out_effects((x_tr, y_tr), validation, fields, names, caps)
    strength = {frozenset(f): st for f, st, _ in ranked}
    extras: dict[frozenset[str], tuple[str, float | None]] = {}
    head, dropped = [], []
    for k, fs, effect in zip(candidates, names, measured, strict=True):
        if k not in fives_active and effect <= 0:
            dropped.append(("x".join(fs), round(effect, 6)))  # did not recur on new rows
            continue
        source = "+".join(
            s for s, on in (("fives", k in fives_active), ("screen", k in screened)) if on
        )
        extras[k] = (source, effect)
        head.append((fs, strength.get(k, 0.0), True, effect))
    head.sort(key=lambda c: -c[3])
    out = [(fs, st, active) for fs, st, active, _ in head]
    out += [(f, st, False) for f, st, _ in ranked if frozenset(f) not in extras]
    report["not_replicated"] = dropped
    report.update(
        selected=len(head),
        from_screen_only=sum(1 for fs, *_ in head if frozenset(fs) not in fives_active),
        seconds=round(time.time() - t0, 2),
    )
    log(
        f"interaction screen: {len(head)} selected crosses ({len(fives_active)} active in FIVES, "
        f"{report['from_screen_only']} from the screen only) ranked by held-out effect; "
        f"{len(dropped)} significant but not recurring on the validation rows "
        f"({report['seconds']:.1f}s)"
    )
    return out, extras, report


def _screen_orders(
    train: tuple[np.ndarray, np.ndarray],
    orders: Sequence[int],
    config: FivesConfig,
    fields: Sequence[str],
    log: Log,
    runner: TaskRunner | None,
) -> tuple[list[tuple[str, ...]], dict[int, isc.ValueCaps], dict[str, Any]]:
    """The screen of every field set of each of ``orders`` on ``train``: (the significant
    field sets, each order's value caps, the report's ``orders`` part). An order whose sets
    number over ``screen_max_sets`` is skipped, and the report says why."""
    x_tr, y_tr = train
    caps: dict[int, isc.ValueCaps] = {}
    significant: list[tuple[str, ...]] = []
    report: dict[str, Any] = {"orders": {}}
    for order in orders:
        sets = math.comb(len(fields), order)
        if sets > config.screen_max_sets:
            reason = (
                f"{len(fields)} fields give {sets:,} sets of {order}, over screen_max_sets = "
                f"{config.screen_max_sets:,} (raise it, or search fewer --fields)"
            )
            report["orders"][str(order)] = {"skipped": reason}
            log(f"interaction screen: order {order} skipped: {reason}")
            continue
        tested, caps[order] = isc.screen(
            x_tr, y_tr, fields, order, config.screen_max_cells, log=log, runner=runner
        )
        zc = isc.critical_z(config.screen_alpha, len(tested))
        hits = [c for c in tested if c.z > zc]
        significant += [c.fields for c in hits]
        report["orders"][str(order)] = {
            "tested": len(tested),
            "critical_z": round(zc, 3),
            "significant": len(hits),
            "top": [("x".join(c.fields), round(c.z, 2)) for c in tested[:10]],
        }
        log(
            f"interaction screen: order {order}: {len(hits)} of {len(tested):,} significant "
            f"(z > {zc:.2f}); top: "
            + ", ".join(f"{'x'.join(c.fields)}:{c.z:.1f}" for c in tested[:5])
        )
    return significant, caps, report
