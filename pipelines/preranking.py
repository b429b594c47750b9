"""``stitchrec train`` with a ``[preranking]`` section: FSCD's three stages, or the two-tower anchor.

::

    [model]                       # the ranking architecture the pre-ranking model inherits
    type = "dcn_v2"               # FSCD needs dnn or dcn_v2

    [preranking]                  # ranking.config.PrerankConfig
    method = "fscd"               # or "two_tower"
    budget = "fields"             # fields | flops | latency
    budget_value = 2
    request_fields = "free"       # request-side fields: kept, amortized, outside the budget
    candidates_per_request = 500  # K: request-side complexity counts c_j / K
    g1 = 1.0                      # c_j = g1 * cost_j + g2 * embedding_dim_j + g3 * cardinality_j
    g2 = 0.01
    g3 = 1e-7
    temperature = 0.1
    fscd_epochs = 1
    finetune_epochs = 1

FSCD (``method = "fscd"``), ``ranking.fscd``:

1. train the pre-ranking model (``[model]``, with ``preranking.mlp`` if given) on every field,
   with a relaxed-Bernoulli keep gate per field and the complexity-weighted penalty;
2. rank the fields by learned keep probability and keep the top ones within the budget (with
   ``request_fields = "free"``, request-side fields are always kept and only per-candidate
   fields compete for the budget);
   ``selection.json`` records every field's keep probability, complexity, cost, dimension,
   cardinality, FLOPs and measured latency, and why it was kept or dropped;
3. fine-tune the same architecture on the kept fields, initialized from the stage-1 weights
   (``ranking.fscd.transfer_weights``), with the plain loss.

The run folder is laid out as ``pipelines.run.paths.RunPaths`` with the stage-3 (or two-tower) model
at its root, so ``stitchrec export --run DIR`` exports the pre-ranking model; the stage-1 model
sits in ``fscd_stage1/``. Every field needs an explicit ``cost`` in the schema file
(``require_costs``). A preranking run does not resume: it retrains from its converted data and
statistics. ``export_cascade_runs`` joins a pre-ranking run and a ranking run in one SavedModel
(``ranking.cascade``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import yaml

from features.dataset import count_rows, input_signature, iter_batches
from features.preprocessing import FeaturePreprocessor, plan_fields
from features.schema import (
    FeatureKind,
    Schema,
    SchemaError,
    expand_names,
    load_schema,
    shipped_schemas,
)
from features.stats import DatasetStats
from pipelines.config import ConfigError, PipelineConfig, load_config
from pipelines.engines import open_runner
from pipelines.export import export_cascade_saved_model
from pipelines.run.data import prepare_data, prepare_stats, use_gpus_if_present
from pipelines.run.model import (
    build_on_sample,
    build_run_model,
    initial_bias,
    load_trained_model,
    save_model,
)
from pipelines.run.paths import Log, RunPaths
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.run.stage_fit import fit
from ranking.config import PrerankConfig
from ranking.fscd import (
    FSCDRankingModel,
    add_field_selection,
    amortized_complexity,
    complexity_alpha,
    field_complexity,
    model_flops,
    select_fields,
    selection_fields,
    transfer_weights,
)
from ranking.models import RankingModel
from ranking.two_tower import build_two_tower, tower_fields
from serving.version_files import atomic_dir

_INPUT_KINDS = ("categorical", "multi_categorical", "numeric")


def schema_file(schema: str) -> Path:
    """The file of a config's ``[data] schema`` (a path or a shipped schema's name)."""
    p = Path(schema)
    if p.exists():
        return p
    shipped = shipped_schemas()
    if schema in shipped:
        return shipped[schema]
    raise SchemaError(f"schema file {schema!r} does not exist")


def check_costs(schema: str) -> None:
    """Every model input of the schema file states its ``cost`` (FSCD's complexity term).

    Raises:
      SchemaError: naming the file and the fields without one.
    """
    p = schema_file(schema)
    load_schema(p)  # a clear SchemaError for a file that is not a valid schema
    text = p.read_text()
    data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    missing = []
    for entry in data.get("fields") or []:
        if entry.get("kind") in _INPUT_KINDS and "cost" not in entry:
            missing += expand_names(entry.get("names") or entry.get("name") or "?")
    if missing:
        raise SchemaError(
            f"schema file {str(p)!r}: FSCD needs a `cost` (relative serving cost, >= 0) on every "
            f"model input; fields {missing} have none (or set preranking.require_costs = false "
            f"to use 1.0)"
        )


def without_sequences(schema: Schema) -> Schema:
    """``schema`` without its ``sequence`` fields: what the pre-ranking models (two-tower,
    FSCD) read. A pre-ranker scores every candidate cheaply on per-field vectors; the history
    is left to the ranking model, which a cascade gives it once per request."""
    keep = [f.name for f in schema.model_inputs if f.kind != FeatureKind.SEQUENCE]
    return schema.select(keep) if len(keep) < len(schema.model_inputs) else schema


def field_groups(schema: Schema) -> dict[str, str | None]:
    """``{model input: group}`` in schema order (what the two-tower model and the cascade
    split request-side from candidate fields by)."""
    return {f.name: f.group for f in schema.model_inputs}


def build_run_two_tower(cfg: PipelineConfig, schema: Schema, stats: DatasetStats) -> tf.keras.Model:
    """The two-tower anchor over ``schema``'s groups (``ranking.two_tower``); sequence fields
    are not read (``without_sequences``)."""
    schema = without_sequences(schema)
    request, items = tower_fields(field_groups(schema))
    multi = FeatureKind.MULTI_CATEGORICAL
    return build_two_tower(
        FeaturePreprocessor(plan_fields(schema.select(request), stats), name="user_preprocessor"),
        FeaturePreprocessor(plan_fields(schema.select(items), stats), name="item_preprocessor"),
        schema.label.name,
        cfg.model,
        cfg.preranking or PrerankConfig(),
        field_dims={f.name: f.embedding_dim for f in schema.model_inputs if f.embedding_dim},
        field_combiners={f.name: f.combiner for f in schema.model_inputs if f.kind == multi},
        initial_bias=initial_bias(stats),
    )


def prerank_model_config(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with ``[model]`` turned into the pre-ranking architecture."""
    pr = cfg.preranking or PrerankConfig()
    model = cfg.model
    if pr.model:
        model = dataclasses.replace(model, type=pr.model)
    if pr.method == "fscd" and model.type not in ("dnn", "dcn_v2"):
        raise ConfigError(
            f"[preranking] method = 'fscd' needs [model] type dnn or dcn_v2 (an interaction-"
            f"focused model), got {model.type!r}"
        )
    if pr.method == "fscd" and model.wide:
        raise ConfigError("[preranking] method = 'fscd' needs a model without a wide term")
    if pr.mlp:
        model = dataclasses.replace(model, mlp=pr.mlp)
    return dataclasses.replace(cfg, model=model)


REQUEST_GROUPS = ("user", "context")


def request_side(schema: Schema, names: list[str], pr: PrerankConfig) -> list[str]:
    """The fields of ``names`` FSCD treats as request-side: group ``user`` or ``context``
    under ``request_fields = "free"``, none under ``"budgeted"``. Ungrouped fields count as
    per-candidate."""
    if pr.request_fields != "free":
        return []
    return [n for n in names if schema.field(n).group in REQUEST_GROUPS]


def field_table(model: RankingModel, schema: Schema, pr: PrerankConfig) -> list[dict]:
    """Per gated field: cost, embedding dimension, cardinality, complexity c_j, the complexity
    charged per candidate (``c_j / candidates_per_request`` for request-side fields under
    ``request_fields = "free"``, else c_j) and alpha (of the charged complexity)."""
    rows = model.preprocessor.embedded_fields
    dims = dict(zip(model.embedding.field_names, model.embedding.dims, strict=True))
    names = selection_fields(model)
    request = set(request_side(schema, names, pr))
    cost = [schema.field(n).cost for n in names]
    dim = [dims.get(n, 1) for n in names]
    card = [rows.get(n, 1) for n in names]
    c = field_complexity(cost, dim, card, pr.g1, pr.g2, pr.g3)
    charged = amortized_complexity(c, [n in request for n in names], pr.candidates_per_request)
    alpha = complexity_alpha(charged)
    return [
        {
            "name": n,
            "group": schema.field(n).group,
            "cost": float(cost[i]),
            "embedding_dim": int(dim[i]),
            "cardinality": int(card[i]),
            "complexity": float(c[i]),
            "charged_complexity": float(charged[i]),
            "alpha": float(alpha[i]),
        }
        for i, n in enumerate(names)
    ]


def penalty_weight(pr: PrerankConfig, stats: DatasetStats) -> float:
    """The stage-1 penalty's weight: ``reg_weight``, or the paper's 1/N (N the training rows
    counted in ``stats``) when it is None."""
    if pr.reg_weight is not None:
        return float(pr.reg_weight)
    if stats.rows < 1:
        raise ValueError(f"reg_weight = 1/N needs training rows; the statistics count {stats.rows}")
    return 1.0 / stats.rows


def build_fscd(cfg: PipelineConfig, schema: Schema, stats: DatasetStats) -> FSCDRankingModel:
    """The stage-1 model: the pre-ranking architecture over every field but the sequences
    (``without_sequences``), with selection."""
    schema = without_sequences(schema)
    pcfg = prerank_model_config(cfg)
    pr = pcfg.preranking or PrerankConfig()
    base = build_run_model(pcfg, schema, stats)
    if pr.tower_residual:
        base.residual = build_run_two_tower(cfg, schema, stats)
    alpha = {r["name"]: r["alpha"] for r in field_table(base, schema, pr)}
    return add_field_selection(
        base,
        alpha,
        temperature=pr.temperature,
        reg_weight=penalty_weight(pr, stats),
        init_keep=pr.init_keep,
    )


def measure_field_latency(
    model: FSCDRankingModel, schema: Schema, files: list[Path], rows: int = 1000, repeats: int = 20
) -> dict[str, float]:
    """Microseconds per candidate to compute each field alone (preprocess + embedding lookup)
    on ``rows`` training rows: the median of ``repeats`` timed calls of one tf.function."""
    batch = next(iter_batches(schema, files, batch_size=rows, shuffle=False))
    out = {}
    plans = {p["name"]: p for p in model.preprocessor.plans}
    for name in selection_fields(model):
        pre = FeaturePreprocessor([plans[name]], name="probe")
        layer = model.embedding.layers_by_field.get(name)
        spec = input_signature([schema.field(name)])

        def one(features: dict[str, tf.Tensor], pre=pre, layer=layer, name=name) -> tf.Tensor:
            ids, dense = pre(features)
            return layer(ids[name]) if layer is not None else dense

        fn = tf.function(one, input_signature=[spec], autograph=False)
        x = {name: tf.constant(batch[name])}
        fn(x)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times)) / len(batch[name]) * 1e6
    return out


def select_stage(
    model: FSCDRankingModel,
    schema: Schema,
    cfg: PipelineConfig,
    files: list[Path],
    budget: str | None = None,
    budget_value: float | None = None,
) -> dict[str, Any]:
    """Stage 2: the selection document (what ``selection.json`` holds); ``budget`` and
    ``budget_value`` override the config's."""
    pcfg = prerank_model_config(cfg)
    pr = pcfg.preranking or PrerankConfig()
    budget = budget or pr.budget
    value = float(budget_value if budget_value is not None else pr.budget_value)
    table = {r["name"]: r for r in field_table(model, schema, pr)}
    theta = model.selection.keep_probability().numpy()
    names = selection_fields(model)
    latency = measure_field_latency(model, schema, files)
    request = request_side(schema, names, pr)
    m = pcfg.model

    def flops(kept: list[str]) -> float:
        # the interaction layers run per candidate over every kept field, request-side
        # included; under "free" the first layer's request part runs once per request
        # (RequestScorer's split), charged 1/K per candidate
        width = sum(table[n]["embedding_dim"] for n in kept)
        req = sum(table[n]["embedding_dim"] for n in kept if n in request)
        return model_flops(
            m.type,
            width,
            m.mlp,
            m.cross_layers,
            m.cross_rank,
            request_width=req,
            candidates_per_request=pr.candidates_per_request,
        )

    def usage(kept: list[str]) -> float:
        if budget == "flops":
            return flops(kept)
        return sum(latency[n] for n in kept if n not in request)  # per-candidate latency

    kept, decisions = select_fields(names, theta, budget, value, usage, request=request)
    for d in decisions:
        d.update(table[d["name"]])
        d["flops_alone"] = flops([d["name"]])
        d["latency_us_per_candidate"] = round(latency[d["name"]], 4)
    return {
        "method": "fscd",
        "budget": {"kind": budget, "value": value},
        "complexity_weights": {"g1": pr.g1, "g2": pr.g2, "g3": pr.g3},
        "temperature": pr.temperature,
        "reg_weight": model.selection.reg_weight,
        "reg_weight_rule": "fixed" if pr.reg_weight is not None else "1/N (N training rows)",
        "request_fields": {
            "mode": pr.request_fields,
            "candidates_per_request": pr.candidates_per_request,
            "fields": request,
        },
        "kept": kept,
        "dropped": [n for n in names if n not in kept],
        "flops_per_candidate": {"all_fields": flops(names), "kept": flops(kept)},
        "fields": decisions,
    }


def finetune_stage(
    cfg: PipelineConfig,
    schema: Schema,
    stats: DatasetStats,
    files: list[Path],
    stage1: FSCDRankingModel,
    kept: list[str],
    log: Log,
    init_from_stage1: bool = True,
    **fit_args: Any,
) -> tuple[tf.keras.Model, Schema, dict[str, Any]]:
    """Stage 3: the pre-ranking model over ``kept``, initialized from stage 1 (or, with
    ``init_from_stage1=False``, freshly initialized), trained with the plain loss for
    ``finetune_epochs`` (``fit_args``: ``fit``'s early stopping and learning rate). Returns
    (model, its schema, training summary). With ``tower_residual`` the model adds the towers
    over every field (stage 1's, or fresh), and its schema is then every field."""
    pcfg = prerank_model_config(cfg)
    pr = pcfg.preranking or PrerankConfig()
    sub = schema.select(kept)
    model = build_run_model(pcfg, sub, stats)
    if pr.tower_residual:
        model.residual = build_run_two_tower(cfg, schema, stats)
        sub = without_sequences(schema)  # the towers read every field but the sequences
    build_on_sample(model, sub, files)
    if init_from_stage1:
        counts = transfer_weights(stage1, model)
        if model.residual is not None and stage1.residual is not None:
            model.residual.set_weights(stage1.residual.get_weights())
            counts["residual"] = len(model.residual.weights)
        log(f"fscd stage 3: {kept}, initialized from stage 1 ({counts})")
    else:
        log(f"fscd stage 3: {kept}, fresh initialization")
    summary = fit(model, sub, files, cfg, pr.finetune_epochs, log, "fscd stage 3", **fit_args)
    return model, sub, summary


def _check_same_method(paths: RunPaths, pr: PrerankConfig) -> None:
    """Refuses a run folder whose checkpointed run is a ranking run or another method's."""
    if paths.config.exists() and tf.train.latest_checkpoint(str(paths.checkpoints)):
        previous = load_config(paths.config).preranking
        if previous is None or previous.method != pr.method:
            raise ConfigError(
                f"{paths.root} holds a {'ranking' if previous is None else previous.method} run; "
                f"train the {pr.method} pre-ranking model into a new output_dir"
            )


def _fscd_stages(
    cfg: PipelineConfig,
    schema: Schema,
    stats: DatasetStats,
    files: tuple[list[Path], list[Path]],
    report: dict[str, Any],
    log: Log,
) -> tuple[RankingModel, Schema]:
    """FSCD's three stages (trained, selected, fine-tuned) on the training ``files[0]``: the
    stage-1 model saved in ``fscd_stage1/`` and scored on the test ``files[1]``, the selection
    written to ``selection.json``; fills ``report`` and returns the fine-tuned model and its
    schema."""
    pr, paths = cfg.preranking or PrerankConfig(), RunPaths(Path(cfg.output_dir))
    train_files, test_files = files
    stage1 = build_fscd(cfg, schema, stats)
    build_on_sample(stage1, schema, train_files)
    report["stage1"] = fit(stage1, schema, train_files, cfg, pr.fscd_epochs, log, "fscd stage 1")
    save_model(stage1, schema, paths.root / "fscd_stage1")
    selection = select_stage(stage1, schema, cfg, train_files)
    groups = {schema.field(n).group for n in selection["kept"]}
    if None not in groups and "item" not in groups:
        selection["warning"] = (
            "no item field kept: the model scores every candidate of a request alike, so "
            "it cannot pre-rank; raise the budget"
        )
        log(f"fscd stage 2: warning: {selection['warning']}")
    (paths.root / "selection.json").write_text(json.dumps(selection, indent=1))
    for d in selection["fields"]:
        log(
            f"fscd stage 2: {d['name']}: keep prob {d['keep_prob']:.3f}, complexity "
            f"{d['complexity']:.3f} -> {'kept' if d['kept'] else 'dropped'} ({d['reason']})"
        )
    if test_files:
        report["stage1"]["test"] = evaluate_model(make_scorer(stage1, schema), schema, test_files)
    model, final_schema, report["stage3"] = finetune_stage(
        cfg,
        schema,
        stats,
        train_files,
        stage1,
        selection["kept"],
        log,
        init_from_stage1=pr.finetune_init == "stage1",
    )
    report["selection"] = {k: selection[k] for k in ("budget", "kept", "dropped")}
    report["interaction"] = type(model.interaction).__name__  # the pre-ranker's own type
    return model, final_schema


def run_preranking(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Trains the ``[preranking]`` model of ``cfg`` into ``cfg.output_dir``; returns the report
    (also ``train_report.json``)."""
    pr = cfg.preranking
    if pr is None:
        raise ConfigError("the config has no [preranking] section")
    prerank_model_config(cfg)  # validates [model] for FSCD before any work
    if pr.method == "fscd" and pr.require_costs:
        check_costs(cfg.data.schema)
    paths = RunPaths(Path(cfg.output_dir))
    _check_same_method(paths, pr)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(cfg.to_toml())
    gpus = use_gpus_if_present(log)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    with open_runner(cfg.engine, log) as runner:
        schema, train_files, _, test_files = prepare_data(cfg, paths, log, runner)
        stats = prepare_stats(
            schema, train_files, paths, log, cfg.data.cap_hash_buckets, runner=runner
        )
    schema = without_sequences(schema)  # pre-rankers leave the history to the ranking model
    report: dict[str, Any] = {"method": pr.method, "seed": cfg.train.seed}
    t0 = time.time()
    if pr.method == "two_tower":
        model = build_run_two_tower(cfg, schema, stats)
        build_on_sample(model, schema, train_files)
        report["train"] = fit(model, schema, train_files, cfg, cfg.train.epochs, log, "two_tower")
        final_schema = schema
    else:
        model, final_schema = _fscd_stages(
            cfg, schema, stats, (train_files, test_files), report, log
        )
    ckpt = save_model(model, final_schema, paths.root)
    test = (
        evaluate_model(make_scorer(model, final_schema), final_schema, test_files)
        if test_files
        else None
    )
    report.update(
        {
            "model": model.name,
            "train_rows": count_rows(train_files),
            "train_seconds": round(time.time() - t0, 2),
            "parameters": int(model.count_params()),
            "test": test,
            "checkpoint": ckpt,
            "devices": [g.name for g in gpus] or ["CPU"],
        }
    )
    paths.report.write_text(json.dumps(report, indent=1))
    return report


def export_cascade_runs(
    prerank_run: str | Path,
    rank_run: str | Path,
    output: str | Path,
    keep: int = 50,
    kernels: bool = False,
) -> Path:
    """One SavedModel chaining a pre-ranking run (FSCD stage 3 or two-tower) and a ranking run
    (``pipelines.export.export_cascade_saved_model``; the ranking run's schema gives the groups; ``kernels``:
    the candidates' lookups as generated ops)."""
    prerank, _, pre_ckpt = load_trained_model(prerank_run)
    rank, schema, rank_ckpt = load_trained_model(rank_run)
    with atomic_dir(output) as tmp:  # schema.toml is in the version before it is in place
        out = export_cascade_saved_model(
            prerank,
            rank,
            field_groups(schema),
            tmp,
            keep,
            extra={"prerank_checkpoint": pre_ckpt, "rank_checkpoint": rank_ckpt},
            kernels=kernels,
        )
        inputs = json.loads((out / "assets.extra" / "stitchrec.json").read_text())["inputs"]
        schema.select(inputs).save(out / "assets.extra" / "schema.toml")
    return Path(output)
