"""Model configs: plain dataclasses, apart from the modules they configure (no TensorFlow import)."""

from __future__ import annotations

import dataclasses

MODEL_TYPES = ("lr", "fm", "dnn", "dcn_v2")
EMBEDDING_METHOD_NAMES = ("full", "hashing", "qr", "bh", "amtl")


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
    embedding_method: str = "full"
    embedding_methods: dict[str, str] = dataclasses.field(default_factory=dict)
    embedding_options: dict[str, dict] = dataclasses.field(default_factory=dict)
    embedding_compression: float = 1.0
    compress_min_rows: int = 1000

    def __post_init__(self) -> None:
        if self.type not in MODEL_TYPES:
            raise ValueError(f"model type {self.type!r} is not one of {list(MODEL_TYPES)}")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
        if isinstance(self.mlp, str):
            raise ValueError(f"mlp must be a list of integers, got {self.mlp!r}")
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        if self.type in ("dnn", "dcn_v2") and not self.mlp:
            raise ValueError(f"model type {self.type!r} needs a non-empty mlp")
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
