"""Typed parameters of `hypospace`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key (a claim naming a sampler or
domain the run does not plan stops it too: core's ``Method.check``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from pipelines.core.api import MethodParams, Probability, Strict, names_of

DOMAINS = ("causal", "voxel3d", "boolean")
OFFLINE = ("uniform_valid", "uniform_prior", "mode_collapse", "history_avoid", "stratified", "noisy", "enumerate")
LLM_VARIANTS = ("llm", "llm_stratified")
VARIANTS = (*OFFLINE, *LLM_VARIANTS)


class CausalCfg(Strict):
    n_nodes: list[int] = Field(min_length=1)  # 2..5 (exact enumeration of all DAGs)
    n_observations: list[int] = Field(min_length=1)  # perturbed nodes per observation set
    sets_per_config: int = Field(ge=1, le=10_000)

    @field_validator("n_nodes")
    @classmethod
    def _n(cls, v: list[int]) -> list[int]:
        if any(not 2 <= n <= 5 for n in v):
            raise ValueError("exact DAG enumeration supports 2..5 nodes (n = 6 has 3.8M DAGs)")
        return v

    @model_validator(mode="after")
    def _o(self):
        if any(o < 1 for o in self.n_observations):
            raise ValueError("n_observations: each entry must be >= 1")
        if max(self.n_observations) > max(self.n_nodes):
            raise ValueError(
                f"n_observations: {max(self.n_observations)} perturbed nodes exceed the largest "
                f"graph ({max(self.n_nodes)} nodes)"
            )
        return self


class VoxelCfg(Strict):
    grid: int = Field(ge=2, le=5)
    max_heights: list[int] = Field(min_length=1)
    min_blocks: PositiveInt  # top-view cells with a block
    max_blocks: PositiveInt
    sets_per_config: int = Field(ge=1, le=10_000)

    @model_validator(mode="after")
    def _ranges(self):
        if any(not 1 <= h <= 6 for h in self.max_heights):
            raise ValueError("max_heights: each entry must lie in 1..6")
        if self.max_blocks < self.min_blocks:
            raise ValueError(f"max_blocks: must be >= min_blocks ({self.min_blocks})")
        if self.max_blocks > self.grid**2:
            raise ValueError(f"max_blocks: {self.max_blocks} exceeds the {self.grid}x{self.grid} grid")
        if max(self.max_heights) ** self.max_blocks > 200_000:
            raise ValueError("max_blocks: |A| = H^blocks would exceed 200,000 structures")
        return self


class BooleanCfg(Strict):
    variables: list[Literal["x", "y", "z"]] = Field(min_length=2, max_length=3)
    max_depth: int = Field(ge=1, le=3)
    operator_sets: list[Literal["basic", "extended"]] = Field(min_length=1)
    min_rows: PositiveInt  # observed truth-table rows per set
    max_rows: PositiveInt
    sets_per_config: int = Field(ge=1, le=10_000)

    @model_validator(mode="after")
    def _rows(self):
        if len(set(self.variables)) != len(self.variables):
            raise ValueError("variables: listed twice")
        if self.max_rows < self.min_rows:
            raise ValueError(f"max_rows: must be >= min_rows ({self.min_rows})")
        if self.max_rows > 2 ** len(self.variables):
            raise ValueError(
                f"max_rows: a truth table of {len(self.variables)} variables has {2 ** len(self.variables)} rows"
            )
        return self


class Domains(Strict):
    enabled: list[Literal["causal", "voxel3d", "boolean"]] = Field(min_length=1)
    causal: CausalCfg
    voxel3d: VoxelCfg
    boolean: BooleanCfg

    @field_validator("enabled")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"a domain is listed twice in {v}")
        return v


class Protocol(Strict):
    query_multiplier: float = Field(gt=0, le=10)  # N = ceil(m · |A|) queries per observation set
    max_queries: PositiveInt | None = None  # cap on N (logged); null: none
    history_window: int = Field(ge=0, le=100)  # prior unique proposals shown / avoided


class Samplers(Strict):
    temperature: PositiveFloat  # softmax(−score / T) of the collapsing samplers
    eta_scale: NonNegativeFloat  # std of the fixed per-hypothesis preference η
    p_obey: Probability  # history_avoid: P(redraw a recent repeat)
    max_redraws: int = Field(ge=1, le=100)
    noise_q: Probability  # noisy: P(corrupt a proposal)


class Llm(Strict):
    base_url: str | None = None  # OpenAI-compatible endpoint (null: cache only)
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # env var holding the key
    temperature: float = Field(ge=0, le=2)
    max_tokens: int = Field(ge=16)
    timeout_s: PositiveFloat
    retries: int = Field(ge=0, le=10)  # re-asks after an unparsable answer
    cache_path: str | None = None
    max_queries: PositiveInt  # cap on N per observation set
    max_sets_per_config: PositiveInt  # observation sets per configuration and seed


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"user_observations": "csv"}
    variants: names_of(VARIANTS, "sampler")  # one train.<variant> node each
    domains: Domains
    protocol: Protocol
    samplers: Samplers
    llm: Llm
    min_bin_sets: PositiveInt  # the "top |A| bin" is the largest with this many sets
    user_observations: str | None = None  # full env: a CSV of observation sets (README)
