"""`hobit`: data.pairs, data.objective_checks (the objective's submodularity and greedy's guarantee on tiny
instances) → train.<variant> (one node per batching variant, the same encoder, optimiser and step count)
→ evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.hobit.checks import objective_checks
from pipelines.hobit.data import make_pairs
from pipelines.hobit.evaluate import derived, make_plots, report_extra
from pipelines.hobit.params import Params
from pipelines.hobit.train import train_variant

SPEC = Method(
    name="hobit",
    params=Params,
    data=[
        Data(make_pairs, "params", "pairs", name="pairs"),
        Data(objective_checks, "params", "objective_checks_json", name="objective_checks"),
    ],
    train=Train(train_variant, ["pairs"], artifacts="tensors"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"checks": "objective_checks_json"},
)
