"""Typed parameters of `hobit`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key (core checks, before the
run, that every claim names a metric this run's variants or declarations produce)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from pipelines.core.api import Fraction, MethodParams, Probability, Strict, VariantName

BATCHERS = ("random", "kmeans", "b3", "batchsampler", "hobit")
HEURISTICS = ("kmeans", "b3", "batchsampler")  # the "state-of-the-art batching" baselines


class Data(Strict):
    """``hobit_synth``: latent hierarchy topic → subtopic → fact; a query and a document view per fact."""

    user_path: str | None = None  # full env: a parquet of pairs (README); None = synthetic
    n_topics: PositiveInt = 16
    n_subtopics: PositiveInt = 8  # per topic
    n_facts: PositiveInt = 64  # per subtopic
    latent_dim: int = Field(default=32, ge=2)
    obs_dim: int = Field(default=64, ge=2)
    w_subtopic: NonNegativeFloat = 0.5
    w_fact: PositiveFloat = 0.25
    noise: NonNegativeFloat = 0.3
    n_test_facts: PositiveInt = 1024
    n_val_facts: NonNegativeInt = 1024  # held out for validation: early stopping and every tuning choice
    dup_rate: Probability = 0.142857  # share of train facts with a second pair

    @model_validator(mode="after")
    def _test_facts(self):
        n = self.n_topics * self.n_subtopics * self.n_facts
        if self.n_test_facts + self.n_val_facts >= n:
            raise ValueError(
                f"n_test_facts: {self.n_test_facts} (+ n_val_facts {self.n_val_facts}) leaves no "
                f"train facts (the world has {n} facts)"
            )
        return self


class Model(Strict):
    hidden: PositiveInt = 128
    out_dim: int = Field(default=32, ge=2)
    tau: float = Field(default=0.05, gt=0, le=10)
    batch_size: int = Field(default=64, ge=4)
    epochs: int = Field(default=10, ge=2)  # at most; epoch 0 is random for every variant
    patience: PositiveInt | None = None  # early stopping: epochs without a better validation recall@1
    flat_window: Fraction = 0.2  # the convergence gate reads the last 20% of the epochs run
    lr: PositiveFloat = 1e-3
    schedule: Literal["constant", "linear_decay"] = "constant"  # linear_decay: lr -> 0 over `epochs`
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat | None = None

    @field_validator("batch_size")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"batch_size must be even (b/2 anchors + b/2 members), got {v}")
        return v


class Graph(Strict):
    """The sparse score graph every graph-based batcher and the miner use."""

    knn_m: int = Field(default=64, ge=2)  # top-M documents kept per query
    refresh_every: PositiveInt = 2  # epochs between kNN / k-means refreshes (from epoch 1)
    chunk: int = Field(default=256, ge=16)  # query rows per chunked matmul + top-M


class Hobit(Strict):
    delta_cos: NonNegativeFloat = 0.1  # a doc within delta_cos (cosine) of the positive is contradictory
    anchors: Literal["knn", "random"] = "knn"
    exp_clip: PositiveFloat = 30.0  # |s_ij - s_ii| clipped before exp


class Baselines(Strict):
    b3_k: PositiveInt = 16  # kNN edges per node for the B3-like graph
    b3_skip_top: NonNegativeInt = 4  # skip the top-p neighbours (likely false negatives)
    b3_resolution: PositiveFloat = 1.0
    walk_k: PositiveInt = 16  # BatchSampler-like walk: neighbours per node
    walk_restart: Fraction = 0.2
    mine_rank_lo: PositiveInt = 5  # ANCE-lite: one negative from ranks [lo, hi]
    mine_rank_hi: PositiveInt = 30

    @model_validator(mode="after")
    def _ranks(self):
        if self.mine_rank_hi < self.mine_rank_lo:
            raise ValueError(f"mine_rank_hi: must be >= mine_rank_lo ({self.mine_rank_lo})")
        return self


class Variant(Strict):
    batcher: Literal["random", "kmeans", "b3", "batchsampler", "hobit"]
    mining: bool = False  # one ANCE-lite mined negative per query
    # hobit's non-contradiction filter: known duplicate ids, the score margin (hobit.delta_cos), both, none
    filter: Literal["ids", "score", "ids_score", "none"] = "ids"
    phi: Literal["log", "linear"] = "log"  # hobit: concave log(1+z) or linear (no concavity)
    anchors: Literal["knn", "random"] | None = None  # hobit: None = hobit.anchors
    objective: Literal["anchors_fixed", "all_members"] = "anchors_fixed"  # hobit: all_members = ablation
    static: bool = False  # hobit: batches built once (epoch 1) and reused
    first_seed_only: bool = False  # budget: run on the first seed only


class Checks(Strict):
    """The objective checks reported with the run (exhaustive on tiny random instances)."""

    n_instances: PositiveInt = 200
    ground: int = Field(default=6, ge=2, le=10)  # candidates in the submodularity check
    n_anchors: PositiveInt = 3
    greedy_ground: int = Field(default=8, ge=2, le=12)
    greedy_budget: PositiveInt = 3


class Eval(Strict):
    ks: list[int] = Field(default_factory=lambda: [1, 10])
    hist_sample: PositiveInt = 4096  # in-batch negative scores kept for the histogram


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.user_path": "parquet"}
    TIMING_METRICS = ("batching_frac_of_epoch",)  # share of the epoch's wall time spent building batches
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    data: Data = Field(default_factory=Data)
    model: Model = Field(default_factory=Model)
    graph: Graph = Field(default_factory=Graph)
    hobit: Hobit = Field(default_factory=Hobit)
    baselines: Baselines = Field(default_factory=Baselines)
    variants: dict[VariantName, Variant] = Field(min_length=1)  # one train.<variant> node each
    checks: Checks = Field(default_factory=Checks)
    eval: Eval = Field(default_factory=Eval)

    def hobit_variants(self) -> list[str]:
        return [v for v, s in self.variants.items() if s.batcher == "hobit"]

    def heuristics(self) -> list[str]:
        return [v for v, s in self.variants.items() if s.batcher in HEURISTICS and not s.mining]

    def diff_pairs(self) -> list[tuple[str, str]]:
        """(a, b) pairs the report compares: every HOBIT-batched variant against every baseline, and
        ``hobit`` against each of its ablations."""
        hobits = self.hobit_variants()
        pairs = [(a, b) for a in hobits for b in self.variants if b not in hobits]
        if "hobit" in hobits:
            pairs += [("hobit", b) for b in hobits if b != "hobit"]
        return pairs
