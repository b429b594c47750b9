"""The datasets of bench/preranking: their pipeline configs, validation rows and requests.

MovieLens (``movielens_config``): configs/movielens.toml with the bench's epochs and
``[preranking]`` settings; a request (``movielens_requests``) is a test user with its earliest
test rating time, its 500 candidates the user's test positives (ratings >= 4) plus movies
sampled uniformly from the catalogue (movieId and its genres from movies.csv).

Synthetic (``synthetic_config``): ``features.synthetic`` with 12 categorical and 4 numeric
fields, vocabularies ``SYNTHETIC_VOCABS``; the categorical fields are grouped ``user`` or
``item`` by ``synthetic_groups``, I1-I4 ``context`` (costs 1.0 for categorical, 0.5 for numeric
fields); a request (``synthetic_requests``) is one test row's user and context fields, its
candidates the item fields of 500 random test rows.

``carve_validation`` holds out the validation rows every model stops early on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features import synthetic
from features.dataset import iter_batches
from features.schema import load_schema
from features.synthetic_config import SyntheticConfig
from pipelines.config import DataConfig, PipelineConfig, TrainConfig, load_config
from ranking.config import ModelConfig, PrerankConfig

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = 500


def log(msg: str) -> None:
    print(msg, flush=True)


def prerank_config(args: argparse.Namespace) -> PrerankConfig:
    """The ``[preranking]`` section from the command line."""
    return PrerankConfig(
        mlp=tuple(args.prerank_mlp),
        model=args.prerank_model,
        reg_weight=args.reg_weight,
        request_fields=args.request_fields,
    )


def movielens_config(out: Path, args: argparse.Namespace) -> PipelineConfig:
    cfg = load_config(ROOT / "configs" / "movielens.toml")
    pr = prerank_config(args)
    train = dataclasses.replace(cfg.train, epochs=args.epochs, max_steps=args.max_steps)
    return dataclasses.replace(cfg, output_dir=str(out), train=train, preranking=pr)


# The synthetic configs (features.synthetic; 12 categorical fields, 4 numeric, 3 planted single
# effects, 3 pure pairs, 1 pure triple, 2 numeric effects, seed 0). "bench": the vocabularies of
# the first tables; it plants singles C10, C11, C12, numeric I2, I3, pairs (C4, C5), (C6, C7),
# (C8, C9) and the triple (C1, C2, C3). "small_crosses": smaller vocabularies for the fields the
# crosses can land on (at most 200 values), so that a pure cross is learnable from 200k rows; it
# plants pairs (C4, C6), (C5, C9), (C7, C8) and the same triple and singles.
SYNTHETIC_VOCABS = {
    "bench": (50, 80, 100, 300, 500, 800, 1000, 700, 600, 5000, 20000, 2000),
    "small_crosses": (20, 30, 40, 60, 80, 100, 150, 200, 120, 5000, 20000, 2000),
}


def synthetic_groups(truth: dict[str, Any], rule: str) -> dict[str, str]:
    """``{categorical field: user | item}``. ``default``: C1-C6 user, C7-C12 item (on the
    "bench" vocabularies one user x item cross, (C6, C7)). ``crossed``: every planted cross
    straddles the request/candidate boundary (user x item crosses, as in ads), which a dot
    product of a user and an item vector holds only at low rank: a pair's first field is a
    user field, its second an item field; a triple's first two are user fields, its last an item
    field; the first planted single (by name) is a user field, the others item fields; the
    remaining fields alternate, user first."""
    names = [f"C{i}" for i in range(1, len(truth["vocab_sizes"]) + 1)]
    if rule == "default":
        return {n: "user" if i < len(names) // 2 else "item" for i, n in enumerate(names)}
    groups: dict[str, str] = {}
    for cross in [*truth["pairs"], *truth["triples"]]:
        fields = cross["fields"]
        groups.update({f: "user" for f in fields[:-1]})
        groups[fields[-1]] = "item"
    singles = sorted((s["field"] for s in truth["single"]), key=lambda n: int(n[1:]))
    groups.update({f: "user" if i == 0 else "item" for i, f in enumerate(singles)})
    rest = [n for n in names if n not in groups]
    groups.update({n: "user" if i % 2 == 0 else "item" for i, n in enumerate(rest)})
    return groups


def synthetic_config(out: Path, args: argparse.Namespace) -> PipelineConfig:
    data = out / "source"  # the generated files; the run converts them into out / "data"
    scfg = SyntheticConfig(
        rows=args.rows,
        num_numeric=4,
        num_categorical=12,
        vocab_sizes=SYNTHETIC_VOCABS[args.synthetic_vocab],
        n_single=3,
        n_pairs=3,
        n_triples=1,
        n_numeric_effects=2,
        seed=0,
    )
    if not (data / "schema.toml").exists():
        synthetic.write_dataset(scfg, data)
    truth = json.loads((data / "ground_truth.json").read_text())
    groups = synthetic_groups(truth, args.synthetic_groups)
    log(f"synthetic groups ({args.synthetic_groups}): {groups}")
    schema = load_schema(data / "schema.toml")
    for f in schema.model_inputs:
        if f.name.startswith("I"):
            schema = schema.replace_field(f.name, group="context", cost=0.5)
        else:
            schema = schema.replace_field(f.name, group=groups[f.name], cost=1.0)
    grouped = data / f"schema_grouped_{args.synthetic_groups}.toml"
    schema.save(grouped)
    pr = prerank_config(args)
    return PipelineConfig(
        output_dir=str(out),
        data=DataConfig(
            schema=str(grouped),
            train=(str(data / "train"),),
            test=(str(data / "test"),),
        ),
        model=ModelConfig(type="dcn_v2", embedding_dim=16, mlp=(128, 64), l2=1e-4),
        train=TrainConfig(batch_size=512, epochs=args.epochs, max_steps=args.max_steps),
        preranking=pr,
    )


def movielens_requests(schema: Any, test_files: list[Path], n: int, rng: np.random.Generator):
    """(request dicts, candidate dicts) for ``n`` test users, 500 candidates each."""
    movies = pacsv.read_csv(
        ROOT.parent / "shared" / "data" / "movielens-latest-small" / "movies.csv"
    ).to_pydict()
    genres = dict(zip((str(m) for m in movies["movieId"]), movies["genres"], strict=True))
    catalogue = np.array(sorted(genres))
    rows = next(iter_batches(schema, test_files, batch_size=10**9, shuffle=False))
    users = np.unique(rows["userId"])
    rng.shuffle(users)
    requests, candidates = [], []
    for u in users:
        mask = rows["userId"] == u
        positives = np.unique(rows["movieId"][mask & (rows["label"] > 0.5)])[: CANDIDATES // 5]
        if positives.size == 0:
            continue
        others = rng.choice(catalogue, CANDIDATES * 2, replace=False)
        others = others[~np.isin(others, positives)][: CANDIDATES - positives.size]
        ids = np.concatenate([positives.astype(str), others])
        requests.append(
            {"userId": np.array([u]), "rating_time": np.array([rows["rating_time"][mask].min()])}
        )
        candidates.append({"movieId": ids, "genres": np.array([genres.get(i, "") for i in ids])})
        if len(requests) == n:
            break
    return requests, candidates


def synthetic_requests(schema: Any, test_files: list[Path], n: int, rng: np.random.Generator):
    rows = next(iter_batches(schema, test_files, batch_size=200_000, shuffle=False))
    size = len(rows[schema.label.name])
    req_names = [f.name for f in schema.model_inputs if f.group in ("user", "context")]
    item_names = [f.name for f in schema.model_inputs if f.group == "item"]
    requests, candidates = [], []
    for i in rng.choice(size, n, replace=False):
        requests.append({k: rows[k][i : i + 1] for k in req_names})
        pick = rng.choice(size, CANDIDATES, replace=False)
        candidates.append({k: rows[k][pick] for k in item_names})
    return requests, candidates


def carve_validation(
    train_files: list[Path], out: Path, fraction: float, seed: int = 0
) -> tuple[list[Path], list[Path]]:
    """(fit files, validation files): ``fraction`` of the training rows, drawn once with a fixed
    seed, held out for early stopping (the same rows for every model and seed)."""
    fit_dir, valid_dir = out / "fit", out / "valid"
    if not (valid_dir / "part-00000.parquet").exists():
        table = pa.concat_tables([pq.read_table(f) for f in train_files])
        hold = np.random.default_rng(seed).random(table.num_rows) < fraction
        fit_dir.mkdir(parents=True, exist_ok=True)
        valid_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.filter(pa.array(~hold)), fit_dir / "part-00000.parquet")
        pq.write_table(table.filter(pa.array(hold)), valid_dir / "part-00000.parquet")
    return [fit_dir / "part-00000.parquet"], [valid_dir / "part-00000.parquet"]
