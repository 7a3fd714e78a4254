"""Typed parameters of `hobit`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key (core checks, before the
run, that every claim names a metric this run's variants or declarations produce)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.core.params import MethodParams, Strict, VariantName

BATCHERS = ("random", "kmeans", "b3", "batchsampler", "hobit")
HEURISTICS = ("kmeans", "b3", "batchsampler")      # the "state-of-the-art batching" baselines


class Data(Strict):
    """``hobit_synth``: latent hierarchy topic → subtopic → fact; a query and a document view per fact."""

    user_path: str | None = None          # full env: a parquet of pairs (README); None = synthetic
    n_topics: int = Field(default=16, ge=1)
    n_subtopics: int = Field(default=8, ge=1)   # per topic
    n_facts: int = Field(default=64, ge=1)      # per subtopic
    latent_dim: int = Field(default=32, ge=2)
    obs_dim: int = Field(default=64, ge=2)
    w_subtopic: float = Field(default=0.5, ge=0)
    w_fact: float = Field(default=0.25, gt=0)
    noise: float = Field(default=0.3, ge=0)
    n_test_facts: int = Field(default=1024, ge=1)
    dup_rate: float = Field(default=0.142857, ge=0, le=1)   # share of train facts with a second pair

    @model_validator(mode="after")
    def _test_facts(self):
        n = self.n_topics * self.n_subtopics * self.n_facts
        if self.n_test_facts >= n:
            raise ValueError(f"n_test_facts: {self.n_test_facts} leaves no train facts (the world has {n} facts)")
        return self


class Model(Strict):
    hidden: int = Field(default=128, ge=1)
    out_dim: int = Field(default=32, ge=2)
    tau: float = Field(default=0.05, gt=0, le=10)
    batch_size: int = Field(default=64, ge=4)
    epochs: int = Field(default=10, ge=2)         # epoch 0 is random for every variant
    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float | None = Field(default=None, gt=0)

    @field_validator("batch_size")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"batch_size must be even (b/2 anchors + b/2 members), got {v}")
        return v


class Graph(Strict):
    """The sparse score graph every graph-based batcher and the miner use."""

    knn_m: int = Field(default=64, ge=2)          # top-M documents kept per query
    refresh_every: int = Field(default=2, ge=1)   # epochs between kNN / k-means refreshes (from epoch 1)
    chunk: int = Field(default=256, ge=16)        # query rows per chunked matmul + top-M


class Hobit(Strict):
    delta_cos: float = Field(default=0.1, ge=0)   # a doc within delta_cos (cosine) of the positive is contradictory
    anchors: Literal["knn", "random"] = "knn"
    exp_clip: float = Field(default=30.0, gt=0)   # |s_ij - s_ii| clipped before exp


class Baselines(Strict):
    b3_k: int = Field(default=16, ge=1)           # kNN edges per node for the B3-like graph
    b3_skip_top: int = Field(default=4, ge=0)     # skip the top-p neighbours (likely false negatives)
    b3_resolution: float = Field(default=1.0, gt=0)
    walk_k: int = Field(default=16, ge=1)         # BatchSampler-like walk: neighbours per node
    walk_restart: float = Field(default=0.2, gt=0, lt=1)
    mine_rank_lo: int = Field(default=5, ge=1)    # ANCE-lite: one negative from ranks [lo, hi]
    mine_rank_hi: int = Field(default=30, ge=1)

    @model_validator(mode="after")
    def _ranks(self):
        if self.mine_rank_hi < self.mine_rank_lo:
            raise ValueError(f"mine_rank_hi: must be >= mine_rank_lo ({self.mine_rank_lo})")
        return self


class Variant(Strict):
    batcher: Literal["random", "kmeans", "b3", "batchsampler", "hobit"]
    mining: bool = False                          # one ANCE-lite mined negative per query
    # hobit's non-contradiction filter: known duplicate ids, the score margin (hobit.delta_cos), both, none
    filter: Literal["ids", "score", "ids_score", "none"] = "ids"
    phi: Literal["log", "linear"] = "log"         # hobit: concave log(1+z) or linear (no concavity)
    anchors: Literal["knn", "random"] | None = None   # hobit: None = hobit.anchors
    objective: Literal["anchors_fixed", "all_members"] = "anchors_fixed"   # hobit: all_members = ablation
    static: bool = False                          # hobit: batches built once (epoch 1) and reused
    first_seed_only: bool = False                 # budget: run on the first seed only


class Checks(Strict):
    """The objective checks reported with the run (exhaustive on tiny random instances)."""

    n_instances: int = Field(default=200, ge=1)
    ground: int = Field(default=6, ge=2, le=10)   # candidates in the submodularity check
    n_anchors: int = Field(default=3, ge=1)
    greedy_ground: int = Field(default=8, ge=2, le=12)
    greedy_budget: int = Field(default=3, ge=1)


class Eval(Strict):
    ks: list[int] = Field(default_factory=lambda: [1, 10])
    hist_sample: int = Field(default=4096, ge=1)  # in-batch negative scores kept for the histogram


class Params(MethodParams):
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    data: Data = Field(default_factory=Data)
    model: Model = Field(default_factory=Model)
    graph: Graph = Field(default_factory=Graph)
    hobit: Hobit = Field(default_factory=Hobit)
    baselines: Baselines = Field(default_factory=Baselines)
    variants: dict[VariantName, Variant] = Field(min_length=1)    # one train.<variant> node each
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
