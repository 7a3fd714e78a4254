"""`recm`: data.advdiff → data.symmetry_gap (the data-level gap per ε) → train.<variant> (one node per
variant: RECM, its rule variants and every baseline; each trains all ε × seeds; train.strict also measures
its layers' symmetry gaps) → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Gain, Method, Ratio, Train
from pipelines.recm.data import eps_tag, make_data
from pipelines.recm.evaluate import (
    data_gaps,
    excess_names,
    excess_over_best,
    gap_names,
    gap_points,
    make_plots,
    min_gain_vs_strict,
    report_extra,
    theta_names,
    theta_tracks_gap,
    theta_vs_layer_gap,
)
from pipelines.recm.params import Params
from pipelines.recm.train import train_variant


def derived(p: Params) -> list:
    """(1) ratios at ε = 0, (2) θ against the gaps, (3) gains over the strict CNN at ε ≥ 0.2 and the excess
    over the better of CR / RPP; per seed, paired, except the data gaps and the excess (see evaluate)."""
    eps = [float(e) for e in p.data.eps]
    big = [e for e in eps if e >= 0.2 - 1e-12]
    out = [
        Fn(gap_points, gap_names, inputs=["gaps"]),
        Fn(theta_tracks_gap, theta_names, needs_=["recm"], inputs=["gaps"]),
        Fn(
            theta_vs_layer_gap,
            ["spearman.final_theta_vs_layer_gap", "fraction.final_theta_le_layer_gap"],
            needs_=["recm", "strict"],
        ),
    ]
    if 0.0 in eps:
        out += [Ratio("test_mse.eps0", "recm", b) for b in ("cr", "strict")]
    out += [Gain(f"test_mse.{eps_tag(e)}", "recm", baseline="strict", lower_is_better=True, relative=True) for e in big]
    if big:
        out += [
            Fn(min_gain_vs_strict, ["relative_gain.test_mse.recm_vs_strict.min_eps_ge0p2"], needs_=["recm", "strict"]),
            Fn(excess_over_best, excess_names, needs_=["recm", "cr", "rpp"]),
        ]
    return out


SPEC = Method(
    name="recm",
    params=Params,
    data=[
        Data(make_data, "params", "data_advdiff", name="advdiff"),
        Data(data_gaps, ["data_advdiff", "params"], "symmetry_gap", name="symmetry_gap"),
    ],
    train=Train(train_variant, ["data_advdiff", "symmetry_gap"], artifacts="tensors"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"gaps": "symmetry_gap"},
)
