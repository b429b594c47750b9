"""Pure triples: can the FIVES search see them, and under which settings (docs/fives.md).

The synthetic generator plants pure triples: their sub-pairs carry no signal. For each seed
this runs the search on three field sets of the synthetic training split, with the default
settings and with ``features.crosses.fives_config.TRIPLE_SEARCH`` (linear readout, contribution strength, W^(k) from
(F - 1) I), with and without Eq. 7's heredity, and prints where each planted cross ranks:

* ``triple+6``: the fields of the first planted triple and 6 noise fields (9 fields);
* ``planted+4``: the fields of every planted pair and triple and 4 noise fields (16 fields);
* ``all``: every field (39).

    .venv/bin/python -m bench.fives.triples --seeds 0 1 2 --sets triple+6 planted+4 \\
        --out runs/bench_fives/triples.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.fives.__main__ import planted_scores, synthetic_split
from features.crosses import fives_config, fives_search

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "triple": dict(fives_config.TRIPLE_SEARCH),
    "triple, no heredity": {**fives_config.TRIPLE_SEARCH, "heredity": False},
}


def field_set(name: str, truth: dict[str, Any]) -> list[str] | None:
    noise = truth["noise_fields"]
    if name == "triple+6":
        return list(truth["triples"][0]["fields"]) + noise[:6]
    if name == "planted+4":
        return [f for c in truth["pairs"] + truth["triples"] for f in c["fields"]] + noise[:4]
    if name == "all":
        return None
    raise ValueError(f"--sets: unknown field set {name!r}; expected triple+6, planted+4 or all")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench_fives/triples.json")
    p.add_argument("--work", default=None, help="scratch folder for the data")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sets", nargs="+", default=["triple+6", "planted+4"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--warmup-epochs", type=int, default=2)
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_fives_triples_"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for seed in args.seeds:
        _, schema, truth, train = synthetic_split(work, args.rows, seed)
        for set_name in args.sets:
            fields = field_set(set_name, truth)
            for variant in args.variants:
                cfg = fives_config.FivesConfig(
                    seed=seed,
                    epochs=args.epochs,
                    warmup_epochs=args.warmup_epochs,
                    **VARIANTS[variant],
                )
                res = fives_search.search(schema, train, cfg, fields=fields, log=lambda _: None)
                keys = [c.key for c in res.crosses]
                wanted = [frozenset(t["fields"]) for t in truth["triples"]]
                if fields is not None:
                    wanted = [t for t in wanted if t <= set(fields)]
                entry = {
                    "seed": seed,
                    "fields": set_name,
                    "variant": variant,
                    "val_auc": res.history[-1]["val_auc"],
                    "active_edges": res.history[-1]["active_edges"],
                    "seconds": round(res.seconds, 1),
                    "triple_ranks": {
                        "x".join(sorted(t)): (keys.index(t) + 1 if t in keys else None)
                        for t in wanted
                    },
                    "ground_truth": planted_scores(res.crosses, truth),
                }
                results.append(entry)
                print(
                    f"seed {seed} {set_name:10s} {variant:20s} val auc {entry['val_auc']:.4f} "
                    f"active {entry['active_edges']} triples {entry['triple_ranks']} "
                    f"planted {entry['ground_truth']['ranks']} ({entry['seconds']}s)",
                    flush=True,
                )
                out.write_text(
                    json.dumps(
                        {"cpus": os.cpu_count(), "args": vars(args), "runs": results}, indent=1
                    )
                    + "\n"
                )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
