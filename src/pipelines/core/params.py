"""Typed parameter schemas: each method declares ``Params`` (a pydantic model) in ``<m>/params.py``.

Node functions take it as a type hint (``def train(data, p: Params)``) and Kedro's own parameter
validation (``kedro.validation``) turns ``params:<m>`` into a ``Params`` before any node runs. The
project's ``kedro run`` validates the same schemas first, in :func:`validate`, so that a wrong type
(strictly: ``true`` is not an int), a missing, unknown or out-of-range key stops the command with one
line naming the key, before any MLflow run is opened.
"""

from __future__ import annotations

import functools
import importlib
import re
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

T = TypeVar("T", bound=BaseModel)


class ParameterError(ValueError):
    """A method's parameters do not match its schema; the message names the key."""


class Strict(BaseModel):
    """Base for every schema block: unknown keys are typos, not silently ignored; types are strict
    (``true`` is not an int, ``"3"`` is not a number), except that an int is a valid float."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# Constrained numbers that are not in pydantic (which has PositiveInt, NonNegativeFloat, ...): methods
# declare ``lr: PositiveFloat = 1e-3`` or ``flip_frac: Fraction`` rather than spelling out ``Field(gt=0, lt=1)``.
Fraction = Annotated[float, Field(gt=0, lt=1)]  # strictly between 0 and 1
Probability = Annotated[float, Field(ge=0, le=1)]  # 0 … 1, both included


VARIANT_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _variant_name(name: str) -> str:
    if not VARIANT_RE.match(name):
        raise ValueError(
            f"variant name {name!r} must be lower-case letters, digits and '_' "
            "(it names the node train.<variant> and its datasets)"
        )
    return name


# A user-chosen variant name (a key of a ``variants: {name: spec}`` mapping): it becomes a node name.
VariantName = Annotated[str, AfterValidator(_variant_name)]

# `auto`: the platform picks (core.runtime.resolve_threads): 1 thread, or every CPU the node may use when the
# method declares that its models scale (MethodParams.threads_scale); `all`: every CPU the node may use;
# an integer wins.
Threads = Literal["auto", "all"] | Annotated[int, Field(ge=1, le=256)]


class ClaimSpec(Strict):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    text: str
    metric: str
    op: Literal[">=", "<=", ">", "<"]
    threshold: float
    tolerance: float | None = Field(default=None, ge=0)  # scoreboard regression tolerance on the value
    requires: list[str] | None = None  # the gates this claim depends on (None: every gate; []: none)


class GateSpec(Strict):
    """A precondition without which the claims test nothing (the base model learned its task, a metric
    has headroom): same schema as a claim; when it fails, the claims that depend on it are untested."""

    id: str = Field(pattern=r"^[a-z0-9_]+$")
    text: str
    metric: str
    op: Literal[">=", "<=", ">", "<"]
    threshold: float


class TinyTransformerParams(Strict):
    """The shared tiny-transformer block (core.seqmodels.TinyConfig's sizes): a method's
    ``model: TinyTransformerParams`` (or a subclass adding its own keys) instead of re-declaring d_model /
    n_layers / n_heads."""

    d_model: int = Field(default=64, ge=8)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)
    d_ff: int = Field(default=0, ge=0)  # 0 → 4 · d_model
    dropout: float = Field(default=0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_split(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: d_model={self.d_model} must split into {self.n_heads} heads")
        return self

    def tiny_config(self, vocab_size: int, **overrides: Any):
        """The ``core.seqmodels.TinyConfig`` of these sizes."""
        from pipelines.core.seqmodels import TinyConfig

        return TinyConfig(
            vocab_size=vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            **overrides,
        )


class Headline(Strict):
    """The one number the scoreboard shows for a method (and which variants count as baselines)."""

    metric: str
    method: str
    lower_is_better: bool = True
    baselines: list[str] | None = None
    tolerance: float | None = Field(default=None, ge=0)


class MethodParams(Strict):
    """What every method's parameters hold; a method's ``Params`` extends it.

    ``THREADS_SCALE``: a method whose models are large enough that intra-op threads pay sets it True (or
    overrides :meth:`threads_scale` with a rule on its sizes); then ``threads: auto`` gives each node every
    CPU it may use, else one thread (tiny models lose more to the threads' synchronisation than they gain)."""

    THREADS_SCALE: ClassVar[bool] = False
    #: metric names (fnmatch patterns, matched against a variant metric's name and a derived metric's name)
    #: that measure the machine rather than the method: wall-clock times, rates and ratios of times. Two
    #: runs of the same code differ in them, so report comparisons (resume checks, runner equivalence,
    #: benchmarks/compare_reports.py) leave them out. Names that say so already (``*_seconds``, ``*_ms``,
    #: ``speedup``, ``latency``, ``throughput``, ``*_per_s`` …) need no entry (core.report.TIMING_NAME).
    TIMING_METRICS: ClassVar[tuple[str, ...]] = ()
    #: the files a user supplies: parameter key under the method (``data.path``) -> the kind
    #: core.schemas.read_user_file reads it as (``parquet``, ``csv``, ``npz``, ``pt``, ``jsonl`` ...); every
    #: such file is read through it, so a missing, empty or cut file stops the run in one line naming the
    #: key and the file. ``USER_FILE_SETTINGS``: the other parameters a run that reads them sets
    #: (``{"data.source": "file"}``). tests/methods/test_user_files.py feeds each one a cut file.
    USER_FILES: ClassVar[dict[str, str]] = {}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {}

    seeds: list[int] = Field(min_length=1)
    threads: Threads = "auto"
    claims: list[ClaimSpec] = Field(default_factory=list)
    gates: list[GateSpec] = Field(default_factory=list)
    paper: str | None = None  # short citation / title, shown by the scoreboard
    headline: Headline | None = None

    def threads_scale(self) -> bool:
        """Whether this run's models gain from more than one intra-op thread (``threads: auto``)."""
        return bool(self.THREADS_SCALE)

    @model_validator(mode="before")
    @classmethod
    def _append_extra_claims(cls, data: Any) -> Any:
        """``extra_claims`` (an env's additions) are appended to ``claims``: env files deep-merge into base but
        lists replace, so an env that adds claims would otherwise have to repeat all of base's."""
        if isinstance(data, dict) and "extra_claims" in data:
            data = dict(data)
            extra = data.pop("extra_claims") or []
            if not isinstance(extra, list):
                raise ValueError("extra_claims: expected a list of claims")
            for i, c in enumerate(extra):  # errors name extra_claims.<i>, not their place in claims
                try:
                    ClaimSpec.model_validate(c)
                except ValidationError as exc:
                    e = exc.errors()[0]
                    where = ".".join(str(x) for x in (f"extra_claims.{i}", *e["loc"]))
                    raise ValueError(f"{where}: {_describe([e])}") from None
            data["claims"] = [*(data.get("claims") or []), *extra]
        return data

    @model_validator(mode="after")
    def _claim_ids_unique(self):
        ids = [c.id for c in self.claims]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"claims: id(s) {twice} declared twice (in claims or extra_claims)")
        gids = [g.id for g in self.gates]
        twice = sorted({i for i in gids if gids.count(i) > 1})
        if twice:
            raise ValueError(f"gates: id(s) {twice} declared twice")
        for c in self.claims:
            unknown = [g for g in (c.requires or []) if g not in gids]
            if unknown:
                raise ValueError(f"claim '{c.id}': requires unknown gate(s) {unknown} (gates: {gids})")
        return self

    def planned_variants(self) -> list[str] | None:
        """The variants this run trains: the ``variants`` list when the method has one (override when its
        variants live elsewhere); None: not checked."""
        v = getattr(self, "variants", None)
        return list(v) if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v) else None

    @model_validator(mode="after")
    def _claims_name_planned_variants(self):
        """A claim on ``variants.<v>.<metric>`` names a variant this run plans: a run that drops the variant
        stops here, before any node runs, not in the report after all the training."""
        planned = self.planned_variants()
        if planned is None:
            return self
        for c in [*self.gates, *self.claims]:
            parts = c.metric.split(".")
            if parts[0] == "variants" and len(parts) >= 3 and parts[1] not in planned:
                raise ValueError(
                    f"claim '{c.id}': metric '{c.metric}' names variant '{parts[1]}', which this run "
                    f"does not plan (variants: {planned}); a run without it declares its own claims "
                    "in an env (conf/<env>/parameters_<method>.yml)"
                )
        return self

    def __str__(self) -> str:
        # kedro-mlflow logs a node's params input as str(value); the platform logs the flattened keys
        return f"<{type(self).__module__}.{type(self).__qualname__}: logged flattened as <method>.*>"


class VariantSeeds(Strict):
    """Opt-in block for a method whose expensive variants run on fewer seeds in the default run's budget:
    ``class Params(MethodParams, VariantSeeds)`` adds the key ``variant_seeds: {variant: n}`` (that variant
    runs on the first n of ``seeds``; a variant not named runs on all of them) and :meth:`seeds_for`, which
    the method's train node loops over instead of ``seeds``. Opt-in, so that a method which does not honour
    the key rejects it as unknown instead of ignoring it."""

    variant_seeds: dict[VariantName, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)

    def known_variants(self) -> list[str] | None:
        """Every variant name the method knows. ``variant_seeds`` may name one this run does not plan, so
        that a shorter ``variants`` list needs no second edit. Default: the planned ones; None: unchecked."""
        planned = getattr(self, "planned_variants", None)
        return planned() if planned else None

    def seeds_for(self, variant: str) -> list[int]:
        """The seeds ``variant`` runs on: the first ``variant_seeds[variant]`` of ``seeds``. A prefix, so a
        variant on fewer seeds still shares them with the others (paired comparisons), and ``kedro sweep``
        over seed lists moves every variant together."""
        seeds = self.seeds  # type: ignore[attr-defined]
        return list(seeds[: self.variant_seeds.get(variant, len(seeds))])

    @model_validator(mode="after")
    def _variant_seeds_name_variants(self):
        known = self.known_variants()
        bad = sorted(set(self.variant_seeds) - set(known)) if known is not None else []
        if bad:
            raise ValueError(f"variant_seeds: unknown variant(s) {bad}: use {sorted(known)}")
        return self


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "tuple", "none", "set", "bytes"}


def known_names(v: list[str], known, what: str = "variant") -> list[str]:
    """A list-of-names parameter (variants, scorers, ...): every name known, none twice. For a
    ``field_validator``; the message names the offending entries."""
    bad = [x for x in v if x not in known]
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}: use {known}")
    if len(set(v)) != len(v):
        raise ValueError(f"a {what} is listed twice in {v}")
    return v


def names_of(known, what: str = "variant", min_length: int = 1):
    """The type of a list-of-names parameter: ``variants: names_of(VARIANTS)`` is a list of at least
    ``min_length`` names from ``known``, none twice (:func:`known_names`; the message names the offenders)."""
    return Annotated[
        list[str], Field(min_length=min_length), AfterValidator(functools.partial(known_names, known=known, what=what))
    ]


def keys_of(known, value: Any):
    """The type of a mapping whose keys come from a fixed set (regimes, the variants a method knows):
    ``answer_len: keys_of(REGIMES, PositiveInt)``. A key outside the set is a typo and stops the run with
    one line naming it (``parameter wedlm.data.answer_len.cuont: unknown key (typo?) ...``), like any other
    key. A mapping whose keys the user chooses (named configurations, each a variant) is
    ``dict[VariantName, ...]`` instead."""
    known = tuple(known)
    if not known:
        raise ValueError("keys_of: at least one known key")
    return dict[Literal[known], value]  # type: ignore[valid-type]


def _clean_loc(loc: tuple) -> tuple:
    """The key path of an error, without the tags pydantic adds for the members of a union."""
    return tuple(
        p
        for p in loc
        if isinstance(p, int) or not (p in _TYPE_TAGS or "[" in p or "-" in p or p.startswith("function"))
    )


def _describe(errs: list[dict[str, Any]]) -> str:
    first = errs[0]
    if first["type"] == "missing":
        return "missing key"
    if first["type"] == "extra_forbidden":
        return "unknown key (typo?)"
    if first["type"] == "literal_error" and first["loc"] and first["loc"][-1] == "[key]":
        return f"unknown key (typo?): use {first.get('ctx', {}).get('expected', 'a known key')}"
    msgs = list(dict.fromkeys(e["msg"] for e in errs))  # a union: what each member expected
    got = first.get("input")
    msg = " or ".join([msgs[0], *(m[:1].lower() + m[1:] for m in msgs[1:])])
    return f"{msg} (got {got!r})" if not isinstance(got, dict | list) else msg


def validate(schema: type[T], raw: Any, root: str) -> T:
    """Parse ``raw`` (the ``params:<root>`` dict) with ``schema`` or raise a one-line ParameterError."""
    if not isinstance(raw, dict):
        raise ParameterError(f"{root}: expected a mapping of parameters, got {type(raw).__name__}")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # a bad key of a keys_of mapping: the error naming the key, not one about its value, comes first
        errors.sort(key=lambda e: not (e["loc"] and e["loc"][-1] == "[key]"))
        loc = _clean_loc(errors[0]["loc"])
        same = [e for e in errors if _clean_loc(e["loc"]) == loc]
        key = ".".join([root, *(str(p) for p in loc)])
        more = len({_clean_loc(e["loc"]) for e in errors}) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        raise ParameterError(f"parameter {key}: {_describe(same)}{suffix}") from None


def schema_for(method: str) -> type[BaseModel] | None:
    """The ``Params`` class of ``pipelines.<method>.params``, or None if the method has none."""
    try:
        module = importlib.import_module(f"pipelines.{method}.params")
    except ModuleNotFoundError as exc:
        if exc.name == f"pipelines.{method}.params":
            return None
        raise
    return getattr(module, "Params", None)
