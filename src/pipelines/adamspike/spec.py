"""`adamspike`: data.fn64 → train.<variant> (one node per run configuration: the quadratic's Adam / GD runs,
the MLP's tracked headline Adam runs, its β₂ / ε ablations and GD; each analyses its own runs: spikes,
stages, alarm rules) → evaluate (the pooled predictor study, the spike-event table, the figures); the
method's contract, built by core."""

from pipelines.adamspike.data import make_data
from pipelines.adamspike.evaluate import plots, pooled, pooled_names, report_extra
from pipelines.adamspike.params import Params
from pipelines.adamspike.train import train_variant
from pipelines.core.api import Data, Fn, Method, Train

SPEC = Method(
    name="adamspike",
    params=Params,
    data=[Data(make_data, "params", "fn64", name="fn64")],
    train=Train(train_variant, ["fn64"], artifacts="tensors"),
    derived=[Fn(pooled, pooled_names, inputs=["artifacts"])],
    plots=plots,
    extra=report_extra,
)
