"""Typed parameters of `trsp`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipelines.core.api import MethodParams, Strict

FIXED_VARIANTS = ("eca", "gc_trsp", "pair_gc", "kmedian", "random", "busiest", "eca_nofill", "pair_gc_nofill")
HYBRID_RE = re.compile(r"^hybrid_(\d{2,3})$")  # hybrid_25 → λ = 0.25


def hybrid_lambda(variant: str) -> float | None:
    """λ of a ``hybrid_<100·λ>`` variant (None for the other variants)."""
    m = HYBRID_RE.match(variant)
    return int(m.group(1)) / 100 if m else None


class City(Strict):
    """The seeded small-market carpool city (README: "Data")."""

    enabled: bool = True
    n_agents: int = Field(ge=8, le=20000)
    plane_km: PositiveFloat
    residential_sigma_km: PositiveFloat
    minority_share: float = Field(ge=0, lt=1)
    job_sigma_km: PositiveFloat
    job_shares: list[float] = Field(min_length=2, max_length=2)
    n_kmeans_candidates: NonNegativeInt
    grid: list[int] = Field(min_length=2, max_length=2)
    ks: list[int] = Field(min_length=1)
    gammas: list[float] = Field(min_length=1)

    @field_validator("job_shares")
    @classmethod
    def _shares(cls, v: list[float]) -> list[float]:
        if min(v) < 0 or sum(v) > 1:
            raise ValueError("job shares must be >= 0 and sum to <= 1 (the rest is uniform)")
        return v

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: list[int]) -> list[int]:
        if min(v) < 0:
            raise ValueError("grid sizes must be >= 0")
        return v

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if min(v) < 2:
            raise ValueError("every budget k must be >= 2 (a route takes two stops)")
        return v

    @field_validator("gammas")
    @classmethod
    def _gammas(cls, v: list[float]) -> list[float]:
        if min(v) < 0:
            raise ValueError("shuttle cost factors must be >= 0")
        return v

    @model_validator(mode="after")
    def _enough_candidates(self):
        m = self.n_kmeans_candidates + self.grid[0] * self.grid[1]
        if self.enabled and m < max(self.ks):
            raise ValueError(f"n_kmeans_candidates: {m} candidate stops in all, fewer than k = {max(self.ks)}")
        return self


class Gadget(Strict):
    """The A → B versus C_j → D_j family (README: "Data")."""

    enabled: bool = True
    walk_ab_km: PositiveFloat
    walk_cd_km: list[float] = Field(min_length=1)
    jitter_km: NonNegativeFloat
    n_random_candidates: int = Field(ge=0, le=50)

    @field_validator("walk_cd_km")
    @classmethod
    def _walks(cls, v: list[float]) -> list[float]:
        if min(v) <= 0:
            raise ValueError("walking distances must be > 0")
        if len({f"{w:g}" for w in v}) != len(v):
            raise ValueError(f"walking distances must differ (metric names use w<W'>): {v}")
        return v


class User(Strict):
    """Full env: the user's trips (and optionally candidate stops and a road graph), checked against their
    schemas before any placement."""

    agents_path: str  # .csv or .parquet: sx, sy, tx, ty (km), optional group
    candidates_path: str | None = None  # .csv or .parquet: x, y (km); none: k-means++ centres + grid
    graph_nodes_path: str | None = None  # road graph: node (int), x, y (km); points snap to the nearest node
    graph_edges_path: str | None = None  # road graph: u, v (int node ids), length_km; shortest paths = metric

    @model_validator(mode="after")
    def _graph(self):
        if (self.graph_nodes_path is None) != (self.graph_edges_path is None):
            raise ValueError("graph_edges_path: a road graph needs both graph_nodes_path and graph_edges_path")
        return self


class Data(Strict):
    city: City
    gadget: Gadget
    user: User | None = None


class KMedian(Strict):
    restarts: int = Field(ge=1, le=50)
    max_passes: PositiveInt


class Core(Strict):
    alphas: list[float] = Field(min_length=1)
    t3: bool = True
    shortlist: int = Field(ge=3, le=60)

    @field_validator("alphas")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        if min(v) <= 0:
            raise ValueError("α must be > 0")
        if len({f"{a:g}" for a in v}) != len(v):
            raise ValueError(f"α values must differ: {v}")
        return v


class Adversarial(Strict):
    """Hill-climbing on instance coordinates against the JR proxy (card: "Adversarial search")."""

    variants: list[str]
    objectives: list[Literal["jr", "core"]] = Field(min_length=1)  # the proxy each search climbs
    starts: list[Literal["clustered", "hubs"]] = Field(min_length=1)  # start kinds, cycled over restarts
    restarts: NonNegativeInt
    steps: NonNegativeInt
    n_min: int = Field(ge=4)
    n_max: int = Field(ge=4)
    m: int = Field(ge=4, le=40)
    ks: list[int] = Field(min_length=1)
    gammas: list[float] = Field(min_length=1)
    step_km: PositiveFloat
    plane_km: PositiveFloat

    @model_validator(mode="after")
    def _sizes(self):
        if self.n_max < self.n_min:
            raise ValueError(f"n_max: {self.n_max} < n_min {self.n_min}")
        if min(self.ks) < 2 or max(self.ks) > self.m:
            raise ValueError(f"ks: every k must be in [2, m = {self.m}]")
        if min(self.gammas) < 0:
            raise ValueError("gammas: shuttle cost factors must be >= 0")
        return self


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {
        "data.user.agents_path": "parquet",
        "data.user.candidates_path": "parquet",
        "data.user.graph_nodes_path": "parquet",
        "data.user.graph_edges_path": "parquet",
    }
    metric: Literal["l1", "l2"]
    deviation: Literal["set", "ordered"]  # what a JR group proposes (README: "Definitions")
    jr_group_factor: float = Field(gt=0, le=10)  # JR groups have ⌈f·n/k⌉ agents (bound claims: f >= 2)
    variants: list[str] = Field(min_length=1)  # one train.<variant> node each
    data: Data
    kmedian: KMedian
    random_draws: int = Field(ge=1, le=1000)
    core: Core
    adversarial: Adversarial
    plot_seed: int | None = None  # the seed whose extra plots/bootstrap are drawn (None: the first seed)
    plot_k: int = Field(ge=2)

    @field_validator("jr_group_factor")
    @classmethod
    def _bound_needs_pairs_of_groups(cls, f: float, info: ValidationInfo) -> float:
        """ECA's (and pair-GC's) 1 + √2 JR bound needs f >= 2: the proof's budget step has a pair open for
        every g = ⌈f·n/k⌉ riders, i.e. at most ⌊n/g⌋ pairs, which fit in k stops only when g >= 2n/k. With
        f < 2 (a legitimate convention to measure, e.g. the card's n/k) a group can be left unserved when the
        budget runs out, so a claim on ``jr_bound_violations`` would test a bound that does not hold."""
        if f < 2:
            bound = [
                c.id
                for c in [*info.data.get("gates", []), *info.data.get("claims", [])]
                if "jr_bound_violations" in c.metric
            ]
            if bound:
                raise ValueError(
                    f"{f:g} < 2, but the 1 + √2 JR bound claimed by {bound} holds only for f >= 2 "
                    "(the proof's budget step: ⌊n/g⌋ pairs fit in k stops only when g >= 2n/k); "
                    "with f < 2 declare claims without jr_bound_violations in an env"
                )
        return f

    @field_validator("variants")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for x in v:
            lam = hybrid_lambda(x)
            if x not in FIXED_VARIANTS and (lam is None or not 0 <= lam <= 1):
                raise ValueError(
                    f"unknown variant {x!r}: use {FIXED_VARIANTS} or hybrid_<100·λ> with λ in [0, 1], e.g. hybrid_50"
                )
        return v

    @model_validator(mode="after")
    def _consistent(self):
        bad = [v for v in self.adversarial.variants if v not in self.variants]
        if bad:
            raise ValueError(f"adversarial.variants: {bad} are not in variants {self.variants}")
        if "random" in self.adversarial.variants:
            raise ValueError("adversarial.variants: 'random' has no deterministic solution to attack")
        if self.plot_seed is None:  # defaults from seeds, so a sweep over seeds needs no plot_seed
            object.__setattr__(self, "plot_seed", self.seeds[0])
        elif self.plot_seed not in self.seeds:
            raise ValueError(f"plot_seed: {self.plot_seed} is not one of seeds {self.seeds}")
        if not (self.data.city.enabled or self.data.gadget.enabled or self.data.user):
            raise ValueError("data: enable the city, the gadget or give user data")
        return self

    @model_validator(mode="after")
    def _claims_planned(self):
        """Every claim's and gate's metric must come from the instance families and searches this run plans,
        so that a run without them stops here, before any node runs, not in the report (that a named
        variant is planned, core checks: Method.check)."""
        for kind, c in [*(("gate", g) for g in self.gates), *(("claim", c) for c in self.claims)]:
            problem = self.unplanned(c.metric)
            if problem:
                raise ValueError(
                    f"{kind} '{c.id}': metric '{c.metric}' {problem}; a run without it declares its "
                    f"own {kind}s in an env (conf/<env>/parameters_trsp.yml, see "
                    "src/pipelines/trsp/README.md)"
                )
        return self

    def unplanned(self, metric: str) -> str | None:
        """Why ``metric`` would be missing from this run's report (None: it is planned, or a variant this run
        does not plan, which core reports)."""
        parts = metric.split(".")
        if parts[0] == "variants":
            if len(parts) != 3:
                return "should read variants.<variant>.<metric>"
            v, name = parts[1], parts[2]
            return self._family_problem(name, v) if v in self.variants else None
        if parts[0] in ("relative_gain", "gain") and len(parts) == 3:
            return self._family_problem(parts[1], "kmedian")
        return None

    def _family_problem(self, name: str, variant: str) -> str | None:
        gd, city = self.data.gadget, self.data.city
        if name.startswith("gadget_w"):
            tags = {f"gadget_w{w:g}_" for w in gd.walk_cd_km}
            if not gd.enabled or not any(name.startswith(t) for t in tags):
                return f"needs the gadget with that W' (data.gadget: enabled {gd.enabled}, walk_cd_km {gd.walk_cd_km})"
        if name.startswith("city_") and not city.enabled:
            return "needs the city (data.city.enabled is false)"
        if name.startswith("adversarial_") and variant not in self.adversarial.variants:
            return f"needs the adversarial search of '{variant}' (adversarial.variants {self.adversarial.variants})"
        if name.startswith("core_a2") and (2.0 not in self.core.alphas or variant == "random"):
            return "needs core factors with alpha = 2 (core.alphas) on a variant that measures the core (not random)"
        return None
