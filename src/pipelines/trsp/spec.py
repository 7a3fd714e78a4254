"""`trsp`: data.instances, data.road_graph → train.<variant> (one node per placement algorithm: every
instance placed and measured, per-seed summaries + the raw rows) → evaluate; the method's contract, built
by core."""

from pipelines.core.api import Data, Fn, Gain, Method, Ratio, Train
from pipelines.trsp.data import make_graph, make_instances
from pipelines.trsp.evaluate import best_other, jr_bound, make_plots, report_extra, violation_totals
from pipelines.trsp.params import Params
from pipelines.trsp.train import train_variant


def derived(p: Params) -> list:
    """k-median's relative social-cost gain over the best other variant and the price of fairness (city
    social cost / k-median's), per seed and paired; the JR bound and the violation totals (point values)."""
    others = tuple(v for v in p.variants if v != "kmedian")
    out = [
        Fn(jr_bound, ["jr_bound"]),
        Fn(violation_totals, lambda p, planned: [f"jr_bound_violations_total.{v}" for v in planned]),
    ]
    if p.data.city.enabled:
        out += [
            Gain(
                "city_social_cost_mean",
                "kmedian",
                best_of=others,
                lower_is_better=True,
                relative=True,
                name="relative_gain.city_social_cost_mean.kmedian_vs_best_other",
            ),
            Fn(best_other, ["city_best_other_variant_social_cost"], needs_=["kmedian"]),
            *[Ratio("city_social_cost_mean", v, "kmedian", name=f"price_of_fairness.{v}") for v in p.variants],
        ]
    if p.data.gadget.enabled and 20.0 in p.data.gadget.walk_cd_km:
        out.append(Gain("gadget_w20_social_cost_mean", "kmedian", baseline="eca", lower_is_better=True))
    return out


SPEC = Method(
    name="trsp",
    params=Params,
    data=[
        Data(make_instances, "params", "instances", name="instances"),
        Data(make_graph, "params", "road_graph", name="road_graph"),
    ],
    train=Train(train_variant, ["instances", "road_graph"], artifacts="json"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs=["instances"],
)
