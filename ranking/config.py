"""Model configs: plain dataclasses, apart from the modules they configure (no TensorFlow import)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

MODEL_TYPES = ("lr", "fm", "dnn", "dcn_v2")
#: ``ModelConfig.sequence_pooling``: how a model reads its behaviour sequences (``none``: it
#: ignores them)
SEQUENCE_POOLINGS = ("din", "mean", "bst", "none")
EMBEDDING_METHOD_NAMES = ("full", "hashing", "qr", "bh", "amtl")
#: the keys ``ModelConfig.embedding_options`` takes per method: the layer's own arguments
#: (``embeddings/``; every layer takes its table's ``initializer``) and bh's ``codes``
EMBEDDING_OPTION_NAMES = {
    "full": ("initializer",),
    "hashing": ("buckets", "seed", "open_vocabulary", "initializer"),
    "qr": ("collisions", "operation", "remainder_initializer", "initializer"),
    "bh": ("block_bits", "code_bits", "split", "fusion", "codes", "initializer"),
    "amtl": ("hidden", "temperature", "length_bias", "length_penalty", "initializer"),
}
MULTITASK_KINDS = ("shared_bottom", "mmoe", "ple", "esmm")
EXPERT_LAYER_KINDS = ("mlp", "moe")
#: how an MLP's ReLU and dropout are differentiated (``ranking.blocks.MLP``'s ``gradient``)
MLP_GRADIENTS = ("backprop", "forward_ad")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """One task of a multi-task model (``ModelConfig.tasks``).

    Attributes:
      name: the task's name (unique among the tasks); names the model's output column.
      label: the schema label the task is trained on.
      weight: the task's weight in the summed loss ``sum_k weight_k * loss_k``.
      defined_on: the name of an earlier task: this task's label is only defined where that
        task's label is 1 (conversion after click). Under ``multitask = "esmm"`` the second task
        is trained on every row as pCTCVR; under the other heads its loss counts only the rows
        whose parent label is 1.
    """

    name: str
    label: str
    weight: float = 1.0
    defined_on: str | None = None

    def __post_init__(self) -> None:
        for key in ("name", "label"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"task {key} must be a non-empty string, got {value!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int | float):
            raise ValueError(f"task {self.name!r}: weight must be a number, got {self.weight!r}")
        if not 0 <= self.weight < float("inf"):
            raise ValueError(
                f"task {self.name!r}: weight must be a finite number >= 0, got {self.weight!r}"
            )
        object.__setattr__(self, "weight", float(self.weight))
        if self.defined_on is not None and not isinstance(self.defined_on, str):
            raise ValueError(
                f"task {self.name!r}: defined_on must be a task name, got {self.defined_on!r}"
            )
        if self.defined_on == self.name:
            raise ValueError(f"task {self.name!r}: defined_on names the task itself")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", self.name):
            raise ValueError(
                f"task name {self.name!r}: expected a letter then letters, digits or '_' (it "
                f"names the exported outputs score_<task> and logit_<task>)"
            )


def tasks_of(values: Any) -> tuple[TaskConfig, ...]:
    """``ModelConfig.tasks`` as TaskConfigs (a mapping becomes one: ``{name = ..., ...}``)."""
    if isinstance(values, str | Mapping) or not isinstance(values, list | tuple):
        raise ValueError(f"tasks must be a list of tasks, got {values!r}")
    tasks = []
    for i, task in enumerate(values):
        if isinstance(task, Mapping):
            allowed = {f.name for f in dataclasses.fields(TaskConfig)}
            unknown = sorted(set(task) - allowed)
            missing = sorted({"name", "label"} - set(task))
            if unknown or missing:
                problem = f"unknown keys {unknown}" if unknown else f"missing keys {missing}"
                raise ValueError(f"tasks[{i}]: {problem}; keys: {sorted(allowed)}")
            task = TaskConfig(**task)
        elif not isinstance(task, TaskConfig):
            raise ValueError(f"tasks[{i}] must be a table of name, label, ..., got {task!r}")
        tasks.append(task)
    return tuple(tasks)


def check_tasks(tasks: tuple[TaskConfig, ...], kind: str) -> None:
    """Raises ValueError for duplicate names, a ``defined_on`` that names no earlier task, or
    tasks that ``kind`` cannot train."""
    seen: list[str] = []
    for task in tasks:
        if task.name in seen:
            raise ValueError(f"tasks: two tasks are named {task.name!r}")
        if task.defined_on is not None and task.defined_on not in seen:
            where = "a later task" if task.defined_on in {t.name for t in tasks} else "no task"
            raise ValueError(
                f"tasks: task {task.name!r}: defined_on = {task.defined_on!r} names {where}; "
                f"it must name an earlier task, one of {seen}"
            )
        seen.append(task.name)
    if kind == "esmm":
        shape_ok = len(tasks) == 2 and tasks[1].defined_on == tasks[0].name
        if tasks and not shape_ok:
            raise ValueError(
                "multitask = 'esmm' needs exactly two tasks, the second defined_on the first "
                f"(click, then conversion after click), got {[t.name for t in tasks]} with "
                f"defined_on {[t.defined_on for t in tasks]}"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What ``build_model`` builds.

    Attributes:
      type: ``lr``, ``fm``, ``dnn`` or ``dcn_v2``.
      embedding_dim: default dimension of field embeddings (a field's schema
        ``embedding_dim`` overrides it; FM needs one dimension for all).
      mlp: hidden sizes of the MLP tower.
      cross_layers: DCN-v2 cross layers.
      cross_rank: DCN-v2 low-rank projection size (0: full rank).
      dropout: dropout after each MLP layer.
      l2: L2 penalty on the embedding rows and linear weights looked up in a batch.
      l2_wide: L2 penalty ``l2_wide * sum(w**2)`` over every weight of the wide (linear) term,
        per-id weights of every field and numeric weights (not the bias), added to each step's
        mean loss: scikit-learn's ``LogisticRegression(C=...)`` on ``N`` training rows is
        ``l2_wide = 1 / (2 * C * N)``. Default 0 (none).
      l1_wide: L1 penalty ``l1_wide * sum(|w|)`` over the same weights. Default 0 (none).
      wide: ``dnn`` and ``dcn_v2`` only: add the wide term of ``lr`` (one weight per id and
        per numeric feature) to the deep model's logit, trained jointly (Wide & Deep, Cheng et
        al., DLRS 2016). ``lr`` and ``fm`` always have it. Not with ``tasks``.
      embedding_method: the embeddings/ method of every categorical field: ``full``,
        ``hashing``, ``qr``, ``bh`` (binary-code hash) or ``amtl``. Bucketized numeric fields
        always use ``full`` tables (they have a handful of rows).
      embedding_methods: per-field overrides of ``embedding_method``.
      embedding_options: per-method layer options, e.g. ``{"bh": {"block_bits": 8}}``; for
        ``bh`` also ``codes``: ``vocabulary`` (default: known values keep their vocabulary id,
        unseen values get a fingerprint) or ``fingerprint`` (no vocabulary in the model at all).
      embedding_compression: when > 1, each field with at least ``compress_min_rows`` rows gets
        the options that make its table about this many times smaller than the full table
        (``options_for_ratio`` of its method); explicit ``embedding_options`` win.
      compress_min_rows: fields with fewer rows keep full tables whatever their method (their
        table costs little; compressing it only loses accuracy).
      tasks: the tasks of a multi-task model (``TaskConfig``; task 0 is the primary task). Empty:
        the single-task model of ``type``. With tasks, ``type`` picks the interaction over the
        embeddings (``dnn``: concatenation, ``dcn_v2``: cross network, ``fm``: FM term; not
        ``lr``) and ``multitask`` the head over it (``ranking.multitask``); ``mlp`` is unused.
      multitask: the multi-task head: ``shared_bottom`` (one shared MLP of ``expert_mlp``),
        ``mmoe`` (``num_experts`` experts, one softmax gate per task), ``ple`` (per task
        ``num_experts`` own experts plus ``shared_experts`` shared ones, ``ple_levels``
        extraction layers) or ``esmm`` (two tasks, click then conversion defined_on it: pCTR and
        pCVR towers over the shared interaction, the second output pCTCVR = pCTR * pCVR).
      num_experts: experts of ``mmoe``; task-specific experts per task of ``ple``.
      expert_mlp: hidden sizes of each expert (the shared MLP of ``shared_bottom``).
      tower_mlp: hidden sizes of each task's tower before its logit (empty: the logit layer
        alone).
      shared_experts: shared experts of each ``ple`` extraction layer.
      ple_levels: extraction layers of ``ple`` (1: Customized Gate Control alone).
      expert_layer: what an expert is: ``mlp`` (an MLP of ``expert_mlp``) or ``moe`` (a sparse
        mixture-of-experts layer of ``ranking.moe``: ``moe_experts`` experts of
        ``expert_mlp`` each, routed by ``moe_top_k`` / ``moe_prototypes`` /
        ``moe_capacity_factor``). A single-task ``dnn`` / ``dcn_v2`` model with ``moe`` has a
        mixture-of-experts layer of ``mlp`` units per expert as its tower.
      sequence_pooling: how the schema's ``sequence`` fields enter the model
        (``ranking.sequence_features``): ``din`` (DIN target attention over the history, the
        candidate's own value of the shared field as the query), ``mean`` (masked mean),
        ``bst`` (one self-attention layer over the candidate and the history) or ``none`` (the
        history is not read). The pooled history joins the interaction as one field vector per
        sequence. ``lr`` models do not read sequences.
      sequence_options: the pooling block's own arguments (``ranking.sequence``), e.g.
        ``{hidden = [80, 40], activation = "dice", softmax = false}`` for ``din`` or
        ``{num_heads = 2}`` for ``bst``.
    """

    type: str = "dcn_v2"
    embedding_dim: int = 16
    mlp: tuple[int, ...] = (256, 128)
    cross_layers: int = 3
    cross_rank: int = 0
    dropout: float = 0.0
    l2: float = 0.0
    l2_wide: float = 0.0
    l1_wide: float = 0.0
    wide: bool = False
    embedding_method: str = "full"
    embedding_methods: dict[str, str] = dataclasses.field(default_factory=dict)
    embedding_options: dict[str, dict] = dataclasses.field(default_factory=dict)
    embedding_compression: float = 1.0
    compress_min_rows: int = 1000
    tasks: tuple[TaskConfig, ...] = dataclasses.field(
        default=(),
        metadata={"expected": "a list of tables {name, label, weight, defined_on}"},
    )
    multitask: str = "shared_bottom"
    num_experts: int = 4
    expert_mlp: tuple[int, ...] = (128,)
    tower_mlp: tuple[int, ...] = (64,)
    shared_experts: int = 1
    ple_levels: int = 1
    expert_layer: str = "mlp"
    moe_experts: int = 8
    moe_top_k: int = 1
    moe_prototypes: int = 1
    moe_capacity_factor: float = 1.25
    sequence_pooling: str = "din"
    sequence_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in MODEL_TYPES:
            raise ValueError(f"model type {self.type!r} is not one of {list(MODEL_TYPES)}")
        self._check_multitask()
        if self.sequence_pooling not in SEQUENCE_POOLINGS:
            raise ValueError(
                f"sequence_pooling {self.sequence_pooling!r} is not one of "
                f"{list(SEQUENCE_POOLINGS)}"
            )
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
        if isinstance(self.mlp, str):
            raise ValueError(f"mlp must be a list of integers, got {self.mlp!r}")
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        if any(u < 1 for u in self.mlp):
            raise ValueError(f"mlp sizes must be >= 1, got {list(self.mlp)}")
        if self.type in ("dnn", "dcn_v2") and not self.mlp:
            raise ValueError(f"model type {self.type!r} needs a non-empty mlp")
        if self.wide and (self.type not in ("dnn", "dcn_v2") or self.tasks):
            raise ValueError(
                "wide = true adds a wide term to a single-task dnn or dcn_v2 model "
                f"(lr and fm always have one), not to {self.type!r}"
                + (" with tasks" if self.tasks else "")
            )
        if self.cross_layers < 1:
            raise ValueError(f"cross_layers must be >= 1, got {self.cross_layers}")
        if self.cross_rank < 0:
            raise ValueError(f"cross_rank must be >= 0 (0: full rank), got {self.cross_rank}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for key in ("l2", "l2_wide", "l1_wide"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        for field, method in {"*": self.embedding_method, **self.embedding_methods}.items():
            if method not in EMBEDDING_METHOD_NAMES:
                where = "embedding_method" if field == "*" else f"embedding_methods[{field!r}]"
                raise ValueError(
                    f"{where} = {method!r} is not one of {list(EMBEDDING_METHOD_NAMES)}"
                )
        unknown = sorted(set(self.embedding_options) - set(EMBEDDING_METHOD_NAMES))
        if unknown:
            raise ValueError(
                f"embedding_options names unknown methods {unknown}; "
                f"methods: {list(EMBEDDING_METHOD_NAMES)}"
            )
        for method, options in self.embedding_options.items():
            if not isinstance(options, Mapping):
                raise ValueError(
                    f"embedding_options.{method} must be a table of options, got {options!r}"
                )
            bad = sorted(set(options) - set(EMBEDDING_OPTION_NAMES[method]))
            if bad:
                raise ValueError(
                    f"embedding_options.{method} has unknown options {bad}; "
                    f"{method} takes {list(EMBEDDING_OPTION_NAMES[method])}"
                )
        codes = self.embedding_options.get("bh", {}).get("codes", "vocabulary")
        if codes not in ("vocabulary", "fingerprint"):
            raise ValueError(
                f"embedding_options.bh.codes = {codes!r}: expected vocabulary or fingerprint"
            )
        if not self.embedding_compression >= 1.0:
            raise ValueError(
                f"embedding_compression must be >= 1, got {self.embedding_compression}"
            )
        if self.compress_min_rows < 1:
            raise ValueError(f"compress_min_rows must be >= 1, got {self.compress_min_rows}")

    def _check_multitask(self) -> None:
        """Validates (and normalizes) ``tasks`` and the multi-task options."""
        object.__setattr__(self, "tasks", tasks_of(self.tasks))
        if self.multitask not in MULTITASK_KINDS:
            raise ValueError(f"multitask {self.multitask!r} is not one of {list(MULTITASK_KINDS)}")
        if self.expert_layer not in EXPERT_LAYER_KINDS:
            raise ValueError(
                f"expert_layer {self.expert_layer!r} is not one of {list(EXPERT_LAYER_KINDS)}"
            )
        for key in ("expert_mlp", "tower_mlp"):
            value = getattr(self, key)
            if isinstance(value, str) or any(isinstance(u, bool) for u in value):
                raise ValueError(f"{key} must be a list of integers, got {value!r}")
            object.__setattr__(self, key, tuple(int(u) for u in value))
            if any(u < 1 for u in getattr(self, key)):
                raise ValueError(f"{key} sizes must be >= 1, got {list(getattr(self, key))}")
        if not self.expert_mlp:
            raise ValueError("expert_mlp must be a non-empty list of sizes")
        for key, lo in (
            ("num_experts", 1),
            ("shared_experts", 0),
            ("ple_levels", 1),
            ("moe_experts", 1),
            ("moe_top_k", 1),
            ("moe_prototypes", 1),
        ):
            if getattr(self, key) < lo:
                raise ValueError(f"{key} must be >= {lo}, got {getattr(self, key)}")
        if not self.moe_capacity_factor > 0:
            raise ValueError(f"moe_capacity_factor must be > 0, got {self.moe_capacity_factor!r}")
        check_tasks(self.tasks, self.multitask)
        if self.tasks and self.type == "lr":
            raise ValueError(
                "model type 'lr' has no multi-task form; with tasks use dnn, dcn_v2 or fm"
            )

    def method_of(self, field: str) -> str:
        """The embedding method of a categorical field."""
        return self.embedding_methods.get(field, self.embedding_method)

    def bh_codes(self) -> str:
        return self.embedding_options.get("bh", {}).get("codes", "vocabulary")


PRERANK_METHODS = ("fscd", "two_tower")
BUDGET_KINDS = ("fields", "flops", "latency")
REQUEST_FIELD_MODES = ("free", "budgeted")


@dataclasses.dataclass(frozen=True)
class PrerankConfig:
    """The ``[preranking]`` section: what ``stitchrec train`` builds instead of a ranking model.

    Attributes:
      method: ``fscd`` (the three FSCD stages: train with feature selection, select by budget,
        fine-tune the interaction-focused pre-ranking model on the kept fields) or
        ``two_tower`` (the vector-product anchor).
      budget: ``fields`` (at most ``budget_value`` fields), ``flops`` (the pre-ranking model's
        multiply-adds x 2 per candidate at most ``budget_value``) or ``latency`` (the summed
        measured feature latency of the kept fields, microseconds per candidate). With
        ``request_fields = "free"`` only per-candidate cost counts (see there).
      budget_value: the budget in the unit of ``budget``.
      request_fields: how FSCD charges request-side fields (schema ``group`` ``user`` or
        ``context``), which a cascade computes once per request (``ranking.cascade``):
        ``free`` (default): always kept; their complexity in the stage-1 penalty is amortized,
        c_j / ``candidates_per_request``; the budget counts per-candidate cost only (``fields``:
        kept item-side fields; ``latency``: the item-side fields' summed latency; ``flops``:
        the model's FLOPs per candidate over all kept fields, since the interaction layers run
        per candidate on the request fields' vectors too). ``budgeted``: every field is charged
        per candidate and competes for the budget (the paper's row-level setting).
      candidates_per_request: K, the candidates one request scores (amortizes request-side
        complexity under ``request_fields = "free"``).
      g1, g2, g3: complexity weights: c_j = g1 * cost_j + g2 * embedding_dim_j +
        g3 * cardinality_j (FSCD, SIGIR'21; EasyRec's defaults 1, 1e-2, 1e-7).
      temperature: of the relaxed-Bernoulli keep variables.
      reg_weight: weight of the complexity penalty sum_j alpha_j * theta_j on the mean loss.
        None (the default): the paper's 1/N, N the stage-1 training rows (the penalty is then
        the prior's term of the summed loss: a field stays if it saves alpha_j nats over the
        whole training set). A fixed value (e.g. 0.01) selects harder and can close a useful
        field's gate before its embedding has learned anything.
      init_keep: starting keep probability of every field (the paper's 0.5).
      selection_learning_rate: learning rate of the keep logits (their own Adam; the model's
        weights use ``[train] learning_rate``), so the gates settle within a few epochs.
      fscd_epochs, finetune_epochs: epochs of stage 1 and stage 3.
      finetune_init: where stage 3 starts: ``stage1`` (the paper: the stage-1 weights of the
        kept fields) or ``scratch`` (fresh weights; on the synthetic bench with user x item
        crosses it closed more of the ranking gap, docs/preranking.md).
      model: the pre-ranking model's type, ``dnn`` or ``dcn_v2`` (empty: ``[model]``'s). A
        ``dnn`` pre-ranker computes its request fields' part of the first layer once per
        request (``ranking.cascade.RequestScorer``), so per candidate it reads only the kept
        item fields; a ``dcn_v2`` one crosses the full width per candidate.
      mlp: hidden sizes of the pre-ranking model's MLP (empty: the ``[model]`` ones).
      tower_dim, tower_mlp: two-tower output dimension and tower hidden sizes.
      tower_residual: FSCD's models (stage 1 and the fine-tuned pre-ranker) add a two-tower
        term over every field, trained jointly (``RankingModel(residual=...)``): the towers
        carry every field's main effects at two-tower cost, so the gates weigh a field by what
        its interactions add, and the kept fields' interaction model rides on the towers. The
        pre-ranker then reads every field (the towers') and the budget counts the kept ones.
      require_costs: every model input must state ``cost`` in the schema file.
      cascade_keep: candidates the pre-ranking passes to ranking in an exported cascade (M).
    """

    method: str = "fscd"
    budget: str = "fields"
    budget_value: float = 2.0
    request_fields: str = "free"
    candidates_per_request: int = 500
    g1: float = 1.0
    g2: float = 1e-2
    g3: float = 1e-7
    temperature: float = 0.1
    reg_weight: float | None = None
    init_keep: float = 0.5
    selection_learning_rate: float = 0.02
    fscd_epochs: int = 1
    finetune_epochs: int = 1
    finetune_init: str = "stage1"
    model: str = ""
    mlp: tuple[int, ...] = ()
    tower_dim: int = 32
    tower_mlp: tuple[int, ...] = (64,)
    tower_residual: bool = False
    require_costs: bool = True
    cascade_keep: int = 50

    def __post_init__(self) -> None:
        if self.method not in PRERANK_METHODS:
            raise ValueError(f"method {self.method!r} is not one of {list(PRERANK_METHODS)}")
        if self.budget not in BUDGET_KINDS:
            raise ValueError(f"budget {self.budget!r} is not one of {list(BUDGET_KINDS)}")
        if self.request_fields not in REQUEST_FIELD_MODES:
            raise ValueError(
                f"request_fields {self.request_fields!r} is not one of {list(REQUEST_FIELD_MODES)}"
            )
        if self.model not in ("", "dnn", "dcn_v2"):
            raise ValueError(
                f"model {self.model!r} is not one of ['dnn', 'dcn_v2'] (or empty: [model]'s type)"
            )
        if self.finetune_init not in ("stage1", "scratch"):
            raise ValueError(
                f"finetune_init {self.finetune_init!r} is not one of ['stage1', 'scratch']"
            )
        if not self.budget_value > 0:
            raise ValueError(f"budget_value must be > 0, got {self.budget_value!r}")
        if self.budget == "fields" and float(self.budget_value) != int(self.budget_value):
            raise ValueError(
                f"budget = 'fields' needs a whole budget_value, got {self.budget_value}"
            )
        for key in ("g1", "g2", "g3", "reg_weight"):
            if key == "reg_weight" and self.reg_weight is None:
                continue
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if not self.selection_learning_rate > 0:
            raise ValueError(
                f"selection_learning_rate must be > 0, got {self.selection_learning_rate!r}"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not isinstance(self.tower_residual, bool):
            raise ValueError(f"tower_residual must be true or false, got {self.tower_residual!r}")
        if not 0 < self.init_keep < 1:
            raise ValueError(f"init_keep must be in (0, 1), got {self.init_keep!r}")
        for key in (
            "fscd_epochs",
            "finetune_epochs",
            "tower_dim",
            "cascade_keep",
            "candidates_per_request",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("mlp", "tower_mlp"):
            if isinstance(getattr(self, key), str):
                raise ValueError(f"{key} must be a list of integers, got {getattr(self, key)!r}")
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        object.__setattr__(self, "tower_mlp", tuple(int(u) for u in self.tower_mlp))
        if any(u < 1 for u in self.mlp + self.tower_mlp):
            raise ValueError(
                f"mlp and tower_mlp sizes must be >= 1, got {self.mlp}, {self.tower_mlp}"
            )
