"""`credal_dro`: data (newsvendor draws + test environments, shifted diabetes regression, group-shift
classification) → ``train.<variant>`` (each solves all three experiments for its variant, grids included)
→ evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Diff, Fn, Gain, Method, Ratio, Train
from pipelines.credal_dro.data import make_classification, make_newsvendor, make_regression
from pipelines.credal_dro.evaluate import (
    grid_metrics,
    grid_names,
    huber_variants,
    make_plots,
    report_extra,
    solve_names,
    solve_summary,
)
from pipelines.credal_dro.params import Params, tasks_of
from pipelines.credal_dro.train import train_variant


def nv_envs(p: Params) -> list[str]:
    """The newsvendor test environments (data.make_newsvendor's names)."""
    tags = [f"{round(100 * e):02d}" for e in p.newsvendor.eps_t]
    return ["clean", *(f"{k}_{t}" for t in tags for k in ("bulk_edge", "tail", "spike"))]


def derived(p: Params) -> list:
    """Per seed, paired against ERM: relative cost gains on the newsvendor (the method on every environment,
    every variant on clean and worst-environment cost), the clean-cost gap, MAE ratios (regression) and
    accuracy differences (classification); Huber's objective at κ against the next smaller κ; the ε-grid
    metrics and solve-time summaries over the raw rows."""
    method = list(p.variants)[0]
    has = {v: set(tasks_of(s)) for v, s in p.variants.items()}
    out: list = []
    for v in p.variants:
        if v == "erm":
            continue
        if "newsvendor" in has[v]:
            envs = nv_envs(p) if v == method else ["clean"]
            out += [
                Gain(f"nv_{c}", v, "erm", lower_is_better=True, relative=True)
                for c in [*(f"cost_{e}" for e in envs), "worst_env_cost"]
            ]
            # (cost − ERM's) / ERM's: the relative gain of a higher-is-better reading, i.e. the clean-cost gap
            out.append(
                Gain(
                    "nv_cost_clean",
                    v,
                    "erm",
                    relative=True,
                    lower_is_better=False,
                    name=f"clean_gap.nv_cost_clean.{v}_vs_erm",
                )
            )
    hub = huber_variants(p)
    out += [
        Ratio("nv_objective", v1, v0, name=f"ratio.nv_objective.{v1}_vs_{v0}")
        for v0, v1 in zip(hub, hub[1:], strict=False)
    ]
    out.append(Fn(grid_metrics, grid_names, inputs=["artifacts"]))
    out.append(Fn(solve_summary, solve_names, inputs=["artifacts"]))
    for v in p.variants:
        if v == "erm":
            continue
        if "regression" in has[v]:
            out += [
                Ratio(f"reg_{c}", v, "erm", name=f"ratio.reg_{c}.{v}_vs_erm")
                for c in ("mae_shifted_contam", "mae_shifted_clean")
            ]
        if "classification" in has[v]:
            out += [Diff(f"cls_{c}", v, "erm") for c in ("worst_group_acc", "acc")]
    return out


SPEC = Method(
    name="credal_dro",
    params=Params,
    data=[
        Data(make_newsvendor, "params", ["newsvendor_samples", "newsvendor_envs"], name="newsvendor"),
        Data(make_regression, "params", "regression_data", name="regression"),
        Data(make_classification, "params", "classification_data", name="classification"),
    ],
    train=Train(
        train_variant,
        ["newsvendor_samples", "newsvendor_envs", "regression_data", "classification_data"],
        artifacts="json",
    ),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
)
