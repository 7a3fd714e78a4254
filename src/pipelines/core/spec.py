"""A method declares, core builds: the method contract as one typed spec.

A method ``m`` writes ``src/pipelines/m/spec.py`` with ``SPEC = Method(...)``:

- ``params``: its ``Params`` (a ``MethodParams`` subclass, top-level key ``m`` in ``parameters_m.yml``);
- ``variants(p)``: the method, every baseline and ablation, from the **validated** params (default
  ``p.variants``);
- ``data``: its data nodes (``Data(func, inputs, outputs, name)``; the input ``"params"`` is the Params);
- ``train``: one ``train_variant(*inputs, p, variant)`` returning the variant's results as one long table
  (:class:`Results` builds it: variant, seed, metric, value, and step for histories), optionally with
  artifacts for the plots (``Train(..., artifacts="tensors" | "json")``, then it returns ``(table, artifacts)``);
- ``derived``: derived metrics as declarations (:class:`Gain`, :class:`Diff`, :class:`Ratio`, or :class:`Fn`
  for what does not fit), computed **per seed, paired** over the seeds both sides share;
- ``plots(p, results, artifacts, **inputs)`` and ``extra(p, results, artifacts, **inputs)`` (report fields
  beyond the contract's), reading the datasets named in ``report_inputs``.

Core then validates the params, checks that every claim and gate names a metric some variant or declaration
produces (one line naming the claim, before any node runs), and builds the Kedro pipeline: nodes
``data.<name>``, ``train.<variant>`` (tags ``train``, ``gpu``), ``evaluate.plots``, ``evaluate.report``, in
namespace ``m``, datasets ``m.results_<variant>`` (parquet) and ``m.<variant>_artifacts_<kind>``. The report
node gathers the tables, aggregates seeds with intervals, evaluates gates and claims, and MLflow logging
follows from the report (core.hooks).
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pipelines.core.params import MethodParams, ParameterError
from pipelines.core.stats import Estimate

RESULT_COLUMNS = ("variant", "seed", "metric", "value", "step")


# ------------------------------------------------------------------------------------------ results
class Results:
    """One variant's results as the long table: ``add(seed, metric=value, ...)`` for final values,
    ``history(seed, metric, values, steps=None)`` for a curve over training steps."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self._rows: list[tuple] = []

    def add(self, seed: int, **values: float) -> Results:
        for k, v in values.items():
            if v is None:
                continue
            self._rows.append((self.variant, int(seed), k, float(v), None))
        return self

    def add_rows(self, rows: Any) -> Results:
        """Wide rows ``{"seed", <metric>: value, ...}`` (dicts or a DataFrame; a ``variant`` column must
        name this variant): each row's numbers become final values of its seed."""
        records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
        for r in records:
            if r.get("variant", self.variant) != self.variant:
                raise ValueError(f"Results({self.variant!r}).add_rows: a row of variant {r['variant']!r}")
            self.add(int(r["seed"]), **{k: v for k, v in r.items() if k not in ("variant", "seed")})
        return self

    def history(self, seed: int, metric: str, values: Iterable[float], steps: Iterable[int] | None = None) -> Results:
        values = list(values.tolist() if hasattr(values, "tolist") else values)
        steps = list(range(len(values))) if steps is None else [int(s) for s in steps]
        if len(steps) != len(values):
            raise ValueError(f"history {metric!r}: {len(steps)} steps but {len(values)} values")
        self._rows += [(self.variant, int(seed), metric, float(v), s) for s, v in zip(steps, values)]
        return self

    def table(self):
        import pandas as pd

        df = pd.DataFrame(self._rows, columns=list(RESULT_COLUMNS))
        df["step"] = df["step"].astype("Int64")
        df["seed"] = df["seed"].astype("int64")
        df["value"] = df["value"].astype("float64")
        return df


class SeedValues:
    """The gathered long tables, read by variant, metric and seed (what derived metrics, plots and
    ``extra`` see)."""

    def __init__(self, tables: Mapping[str, Any]) -> None:
        import pandas as pd

        frames = [t for t in tables.values() if t is not None and len(t)]
        self.table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
        # a table may hold rows of more variants than its key (one node timing several side by side, or
        # a second condition of one fit): they follow the key, in the order they appear
        self.variants = list(
            dict.fromkeys(
                x for k, t in tables.items() for x in [k, *([] if t is None else dict.fromkeys(t["variant"]))]
            )
        )
        final = self.table[self.table["step"].isna()]
        self._final: dict[str, dict[str, dict[int, float]]] = {}
        for v, s, k, x in zip(final["variant"], final["seed"], final["metric"], final["value"]):
            self._final.setdefault(v, {}).setdefault(k, {})[int(s)] = float(x)

    def has(self, variant: str, metric: str) -> bool:
        return metric in self._final.get(variant, {})

    def per_seed(self, variant: str, metric: str) -> dict[int, float]:
        """``{seed: value}`` of one variant's metric (KeyError naming both when it was not produced)."""
        try:
            return dict(self._final[variant][metric])
        except KeyError:
            raise KeyError(f"variant '{variant}' produced no metric '{metric}'") from None

    def mean(self, variant: str, metric: str) -> float:
        xs = list(self.per_seed(variant, metric).values())
        return sum(xs) / len(xs)

    def metrics(self, variant: str) -> dict[str, dict[int, float]]:
        return {k: dict(d) for k, d in self._final.get(variant, {}).items()}

    def rows(self) -> list[dict[str, Any]]:
        """Wide rows ``{"variant", "seed", <metric>: value}`` (the report's per-seed table)."""
        out = []
        for v in dict.fromkeys([*self.variants, *self._final]):  # also rows a node made for other variants
            seeds = sorted({s for d in self._final.get(v, {}).values() for s in d})
            for s in seeds:
                row = {"variant": v, "seed": s}
                row.update({k: d[s] for k, d in self._final[v].items() if s in d})
                out.append(row)
        return out

    def history(self, variant: str, metric: str, seed: int | None = None) -> dict[str, list]:
        """One curve ``{"step", "value"}`` (the first seed that has it, unless ``seed`` is given)."""
        t = self.table
        t = t[(t["variant"] == variant) & (t["metric"] == metric) & t["step"].notna()]
        if seed is None and len(t):
            seed = int(t["seed"].min())
        t = t[t["seed"] == seed].sort_values("step")
        return {"step": [int(s) for s in t["step"]], "value": [float(x) for x in t["value"]]}

    def histories(self) -> dict[str, dict[str, dict[str, list]]]:
        t = self.table[self.table["step"].notna()]
        out: dict[str, dict[str, dict[str, list]]] = {}
        for v in self.variants:
            for k in dict.fromkeys(t.loc[t["variant"] == v, "metric"]):
                out.setdefault(v, {})[k] = self.history(v, k)
        return out


def json_records(rows: Any) -> list[dict[str, Any]]:
    """Rows (a DataFrame or a list of dicts) as JSON-able records: numpy scalars become Python ones (a train
    node's raw rows kept as its ``artifacts="json"``)."""
    import numpy as np

    def plain(x: Any) -> Any:
        return x.item() if isinstance(x, np.generic) else x

    records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    return [{k: plain(v) for k, v in r.items()} for r in records]


def paired(*series: Mapping[int, float]) -> list[int]:
    """The seeds every series has (the pairs a derived metric is computed on), sorted."""
    common = set(series[0]) if series else set()
    for s in series[1:]:
        common &= set(s)
    return sorted(common)


# ---------------------------------------------------------------------------------- declarations
class Derived:
    """A derived metric declaration: the names it produces, the variants it needs, and per-seed values."""

    def names(self, p: Any, planned: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def needs(self) -> list[str]:
        return []

    def active(self, planned: Sequence[str]) -> bool:
        return all(v in planned for v in self.needs())

    def compute(self, values: SeedValues, p: Any, planned: Sequence[str], inputs: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


def _pairwise(values: SeedValues, metric: str, a: str, b: str, f: Callable[[float, float], float]) -> dict[int, float]:
    xa, xb = values.per_seed(a, metric), values.per_seed(b, metric)
    return {s: f(xa[s], xb[s]) for s in paired(xa, xb)}


@dataclass(frozen=True)
class Gain(Derived):
    """How much better ``method`` is than ``baseline`` (or than the best of ``best_of``, chosen by its mean
    over the shared seeds, then paired seed by seed): ``baseline − method`` for a lower-is-better metric,
    ``method − baseline`` otherwise; ``relative=True`` divides by ``|baseline|`` per seed (core.metrics.
    relative_gain). Positive means the method is better. Name: ``gain.<metric>.<method>_vs_<baseline>``
    (``relative_gain.`` when relative; ``_vs_best_<label>`` with ``best_of``)."""

    metric: str
    method: str
    baseline: str | None = None
    best_of: tuple[str, ...] | None = None
    label: str | None = None
    lower_is_better: bool = False
    relative: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.best_of is None):
            raise TypeError(f"Gain({self.metric!r}, {self.method!r}): give exactly one of baseline= or best_of=")
        if self.best_of is not None:
            object.__setattr__(self, "best_of", tuple(self.best_of))
            if not self.label and not self.name:
                raise TypeError(f"Gain({self.metric!r}, {self.method!r}, best_of=...): give label= (or name=)")

    def _name(self) -> str:
        if self.name:
            return self.name
        other = self.baseline if self.baseline is not None else f"best_{self.label}"
        return f"{'relative_gain' if self.relative else 'gain'}.{self.metric}.{self.method}_vs_{other}"

    def names(self, p, planned):
        return [self._name()] if self.active(planned) else []

    def needs(self):
        return [self.method] if self.best_of is not None else [self.method, self.baseline]

    def active(self, planned):
        if self.best_of is not None:
            return self.method in planned and any(b in planned for b in self.best_of)
        return super().active(planned)

    def compute(self, values, p, planned, inputs):
        if not self.active(planned):
            return {}
        if self.best_of is not None:
            cands = [b for b in self.best_of if b in planned and values.has(b, self.metric)]
            if not cands:
                return {}
            pick = min if self.lower_is_better else max
            baseline = pick(cands, key=lambda b: values.mean(b, self.metric))
        else:
            baseline = self.baseline
        from pipelines.core.metrics import relative_gain

        if self.relative:

            def f(m, b):
                return relative_gain(method=m, baseline=b, lower_is_better=self.lower_is_better)
        else:

            def f(m, b):
                return (b - m) if self.lower_is_better else (m - b)

        return {self._name(): _pairwise(values, self.metric, self.method, baseline, f)}


@dataclass(frozen=True)
class _Pairwise(Derived):
    """``op(a, b)`` per seed over the seeds both share: ``<kind>.<metric>.<a><joiner><b>`` (or ``name``); a
    subclass names its ``kind``, ``joiner`` and ``op`` in its class line."""

    metric: str
    a: str
    b: str
    name: str | None = None
    kind: ClassVar[str]
    joiner: ClassVar[str]
    op: ClassVar[Callable[[float, float], float]]

    def __init_subclass__(cls, kind: str, joiner: str, op: Callable[[float, float], float], **kw) -> None:
        super().__init_subclass__(**kw)
        cls.kind, cls.joiner, cls.op = kind, joiner, staticmethod(op)

    def names(self, p, planned):
        if not self.active(planned):
            return []
        return [self.name or f"{self.kind}.{self.metric}.{self.a}{self.joiner}{self.b}"]

    def needs(self):
        return [self.a, self.b]

    def compute(self, values, p, planned, inputs):
        if not self.active(planned):
            return {}
        return {self.names(p, planned)[0]: _pairwise(values, self.metric, self.a, self.b, self.op)}


def _ratio(x: float, y: float) -> float:
    return x / y if y else math.nan


@dataclass(frozen=True)
class Diff(_Pairwise, kind="diff", joiner="_minus_", op=operator.sub):
    """``a − b`` per seed: ``diff.<metric>.<a>_minus_<b>`` (or ``name``)."""


@dataclass(frozen=True)
class Ratio(_Pairwise, kind="ratio", joiner="_over_", op=_ratio):
    """``a / b`` per seed: ``ratio.<metric>.<a>_over_<b>`` (or ``name``); the mean of per-seed ratios."""


@dataclass(frozen=True)
class Fn(Derived):
    """A named function for what the small declarations cannot say: ``func(values, p, **inputs)`` returns
    ``{name: {seed: value}}`` (per-seed, an interval follows), ``{name: Estimate}`` or ``{name: float}``
    (a point value). ``names`` lists what it produces (or ``names(p, planned)`` computes it), so claims on
    them are checked before the run; ``needs`` the variants it reads (inactive when one is not planned);
    ``inputs`` the report inputs (spec.report_inputs) it reads, or ``"artifacts"`` (the train artifacts by
    variant). A per-seed name ``variants.<v>.<metric>`` joins variant v's rows (see :func:`variant_rows`)."""

    func: Callable[..., Mapping[str, Any]]
    names_: Sequence[str] | Callable[[Any, Sequence[str]], Sequence[str]] = ()
    needs_: Sequence[str] = ()
    inputs: Sequence[str] = ()

    def names(self, p, planned):
        if not self.active(planned):
            return []
        return list(self.names_(p, planned) if callable(self.names_) else self.names_)

    def needs(self):
        return list(self.needs_)

    def compute(self, values, p, planned, inputs):
        if not self.active(planned):
            return {}
        out = dict(self.func(values, p, **{k: inputs[k] for k in self.inputs}))
        declared = set(self.names(p, planned))
        undeclared = sorted(set(out) - declared)
        if undeclared and not callable(self.names_) and self.names_:
            raise ValueError(f"Fn {self.func.__name__}: produced {undeclared}, not in its declared names")
        return out


@dataclass(frozen=True)
class Data:
    """A node ``<stage>.<name>``: ``func(*inputs)`` → outputs; the input ``"params"`` is the Params.
    ``stage="train"`` for a shared training step the variants build on (a base model every variant
    fine-tunes: node ``train.<name>``, tags ``train``, ``gpu``); its long table joins the report when the
    method lists it in ``Method.results_from``."""

    func: Callable[..., Any]
    inputs: str | Sequence[str] | Mapping[str, str]
    outputs: str | Sequence[str] | Mapping[str, str] | None
    name: str
    tags: Sequence[str] = ()
    stage: Literal["data", "train"] = "data"


@dataclass(frozen=True)
class Train:
    """``train_variant(*inputs, p, variant)``: one node ``train.<variant>`` per planned variant. ``inputs``
    may be ``inputs(p, variant)`` (variants reading different datasets); a mapping ``{kwarg: dataset}``
    calls ``train_variant(**inputs, p=p, variant=variant)``."""

    func: Callable[..., Any]
    inputs: Sequence[str] | Mapping[str, str] | Callable[[Any, str], Sequence[str] | Mapping[str, str]] = ()
    artifacts: Literal["tensors", "json"] | None = None
    gpu: bool = True


def _default_variants(p: Any) -> list[str]:
    return list(p.variants)


@dataclass(frozen=True)
class Method:
    name: str
    params: type[MethodParams]
    train: Train
    data: Sequence[Data] = ()
    variants: Callable[[Any], list[str]] = _default_variants
    derived: Sequence[Derived] | Callable[[Any], Sequence[Derived]] = ()  # or derived(p)
    plots: Callable[..., Mapping[str, Any]] | None = None
    extra: Callable[..., Mapping[str, Any]] | None = None
    report_inputs: Sequence[str] | Mapping[str, str] = ()  # datasets (or {kwarg: dataset}) evaluate reads
    produces: Callable[[Any, str], Iterable[str]] | None = None  # metric names variant v's table has
    results_from: Mapping[str, str] = field(default_factory=dict)  # {variant: long table} not from train_variant
    reports: Callable[[Any], Iterable[str]] | None = None  # row variants of nodes that report others than their own
    description: str = ""
    extensions: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------- checking
    def declarations(self, p: Any) -> list[Derived]:
        return list(self.derived(p) if callable(self.derived) else self.derived)

    def derived_names(self, p: Any, planned: Sequence[str]) -> set[str]:
        return {n for d in self.declarations(p) for n in d.names(p, planned)}

    def trained(self, p: Any) -> list[str]:
        """The variants ``train_variant`` trains (one node each)."""
        return [v for v in self.variants(p) if v not in self.results_from]

    def check(self, p: Any) -> list[str]:
        """Before any node runs: every claim and gate names a planned variant's metric or a declared derived
        metric. Returns the planned variants (with those of ``results_from``); raises ParameterError naming
        the first bad claim."""
        planned = [*self.results_from, *self.trained(p)]
        if not self.trained(p):
            raise ParameterError(f"parameter {self.name}.variants: no variant planned")
        twice = sorted({v for v in planned if planned.count(v) > 1})
        if twice:
            raise ParameterError(f"parameter {self.name}.variants: {twice} listed twice")
        reported = list(dict.fromkeys([*planned, *(self.reports(p) if self.reports else ())]))
        derived = self.derived_names(p, reported)
        for kind, items in (("gate", p.gates), ("claim", p.claims)):
            for c in items:
                parts = c.metric.split(".")
                if parts[0] == "variants" and len(parts) >= 3:
                    v, metric = parts[1], ".".join(parts[2:])
                    if v not in reported:
                        raise ParameterError(
                            f"{kind} '{c.id}': metric '{c.metric}' names variant '{v}', which this run does not "
                            f"plan (variants: {planned}); a run without it declares its own {kind}s in an env"
                        )
                    if self.produces is not None and metric not in set(self.produces(p, v)):
                        raise ParameterError(f"{kind} '{c.id}': variant '{v}' produces no metric '{metric}'")
                elif c.metric not in derived and not c.metric.endswith((".ci_low", ".ci_high")):
                    near = sorted(
                        n
                        for n in derived
                        if n.split(".")[-1] == c.metric.split(".")[-1] or n.split(".")[:2] == parts[:2]
                    )[:4]
                    hint = f"; declared: {near}" if near else ""
                    raise ParameterError(
                        f"{kind} '{c.id}': metric '{c.metric}' is produced by no variant or "
                        f"derived-metric declaration in this run{hint}"
                    )
        return planned

    def inputs_map(self) -> dict[str, str]:
        ri = self.report_inputs
        return dict(ri) if isinstance(ri, Mapping) else {k: k for k in ri}

    # --------------------------------------------------------------------------------- pipeline
    def pipeline(self, p: Any):
        """The Kedro pipeline of the validated params ``p``."""
        from kedro.pipeline import Pipeline, node, pipeline

        from pipelines.core.variants import bind_variant

        planned = self.check(p)
        P = f"params:{self.name}"

        def names(x):
            if isinstance(x, str):
                return P if x == "params" else x
            if isinstance(x, Mapping):
                return {k: names(v) for k, v in x.items()}
            return [names(v) for v in x]

        tags = ["train", "gpu"] if self.train.gpu else ["train"]
        nodes = [
            node(
                d.func,
                names(d.inputs),
                d.outputs,
                name=f"{d.stage}.{d.name}",
                tags=[*(tags if d.stage == "train" else ["data"]), *d.tags],
            )
            for d in self.data
        ]
        trained = [v for v in planned if v not in self.results_from]
        results = {v: self.results_from.get(v, f"results_{v}") for v in planned}
        arts = {v: f"{v}_artifacts_{self.train.artifacts}" for v in trained} if self.train.artifacts else {}
        for v in trained:
            outs = [results[v], arts[v]] if arts else results[v]
            ins = self.train.inputs(p, v) if callable(self.train.inputs) else self.train.inputs
            ins = {**names(ins), "p": P} if isinstance(ins, Mapping) else [*names(list(ins)), P]
            nodes.append(node(bind_variant(self.train.func, v), ins, outs, name=f"train.{v}", tags=tags))
        gathered = {
            "p": P,
            **{f"r__{v}": results[v] for v in planned},
            **{f"a__{v}": a for v, a in arts.items()},
            **{f"i__{k}": ds for k, ds in self.inputs_map().items()},
        }
        nodes.append(node(_bound(make_plots, self.name), gathered, "plots", name="evaluate.plots", tags=["evaluate"]))
        nodes.append(
            node(
                _bound(make_report, self.name),
                {**gathered, "plots": "plots"},
                "report",
                name="evaluate.report",
                tags=["evaluate"],
            )
        )
        return pipeline(Pipeline(nodes), namespace=self.name, parameters={P: P})


# ------------------------------------------------------------------------------ evaluate nodes
def _bound(func: Callable, method: str) -> functools.partial:
    """``func`` with the method's name bound, carrying ``func``'s name and annotations (Kedro names the
    node's function and reads its type hints from them; a bare partial has neither)."""
    return functools.update_wrapper(functools.partial(func, method), func)


def load_spec(method: str) -> Method:
    return importlib.import_module(f"pipelines.{method}.spec").SPEC


def _split(spec: Method, kw: Mapping[str, Any]):
    from pipelines.core.params import validate

    p = kw["p"]
    if not isinstance(p, MethodParams):
        p = validate(spec.params, p, spec.name)
    tables = {k[3:]: v for k, v in kw.items() if k.startswith("r__")}
    arts = {k[3:]: v for k, v in kw.items() if k.startswith("a__")}
    inputs = {k[3:]: v for k, v in kw.items() if k.startswith("i__")}
    return p, SeedValues(tables), arts, inputs


def _accepted(func: Callable, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The report inputs ``func`` takes by name (all of them if it takes ``**kwargs``)."""
    import inspect

    params = inspect.signature(func).parameters
    if any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values()):
        return dict(inputs)
    return {k: v for k, v in inputs.items() if k in params}


def make_plots(method: str, **kw: Any) -> dict[str, Any]:
    spec = load_spec(method)
    p, values, arts, inputs = _split(spec, kw)
    if spec.plots is None:
        return default_plots(values)
    return dict(spec.plots(p, values, arts, **_accepted(spec.plots, inputs)))


def default_plots(values: SeedValues) -> dict[str, Any]:
    """Without a plots function: each history metric's curves, one line per variant (first seed)."""
    import matplotlib.pyplot as plt

    figs = {}
    hist = values.histories()
    for metric in sorted({k for h in hist.values() for k in h}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for v, h in hist.items():
            if metric in h:
                ax.plot(h[metric]["step"], h[metric]["value"], label=v)
        ax.set(xlabel="step", ylabel=metric, title=metric)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs[f"history_{metric}"] = fig
    return figs


def compute_derived(
    spec: Method, p: Any, values: SeedValues, planned: Sequence[str], inputs: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, dict[int, float]]]:
    """(point metrics incl. Estimates, per-seed metrics) of every active declaration."""
    point: dict[str, Any] = {}
    per_seed: dict[str, dict[int, float]] = {}
    for d in spec.declarations(p):
        for name, val in d.compute(values, p, planned, inputs).items():
            if isinstance(val, Mapping):
                per_seed[name] = {int(s): float(x) for s, x in val.items()}
            else:
                point[name] = val if isinstance(val, Estimate) else float(val)
    return point, per_seed


def make_report(method: str, plots: Any = (), **kw: Any) -> dict[str, Any]:
    from pipelines.core.report import build_report

    spec = load_spec(method)
    p, values, arts, inputs = _split(spec, kw)
    planned = values.variants
    point, per_seed = compute_derived(spec, p, values, planned, {**inputs, "artifacts": arts})
    extra = dict(spec.extra(p, values, arts, **_accepted(spec.extra, inputs))) if spec.extra else {}
    hist = values.histories()
    return build_report(
        method,
        p,
        variant_rows(values.rows(), per_seed, planned),
        point,
        artifacts=plots,
        extra=extra,
        histories=hist or None,
        derived_per_seed=per_seed,
    )


def variant_rows(
    rows: list[dict[str, Any]], per_seed: dict[str, dict[int, float]], planned: Sequence[str]
) -> list[dict[str, Any]]:
    """A per-seed declaration named ``variants.<v>.<metric>`` (a comparison that belongs to variant v, e.g.
    its error against another variant) joins v's rows, as if v had produced it; ``per_seed`` loses it."""
    for name in [
        n for n in per_seed if n.count(".") >= 2 and n.split(".")[0] == "variants" and n.split(".")[1] in planned
    ]:
        _, v, metric = name.split(".", 2)
        left = dict(per_seed.pop(name))
        for r in rows:
            if r["variant"] == v and r["seed"] in left:
                r[metric] = left.pop(r["seed"])
        rows += [{"variant": v, "seed": s, metric: x} for s, x in left.items()]
    return rows


__all__ = [
    "Data",
    "Derived",
    "Diff",
    "Fn",
    "Gain",
    "Method",
    "json_records",
    "Ratio",
    "Results",
    "SeedValues",
    "Train",
    "default_plots",
    "load_spec",
    "paired",
]
