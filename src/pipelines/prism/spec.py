"""`prism`: task + noise calibration → train.<variant> (the ε grid and the gauge stress test run inside
each) → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Gain, Method, Train
from pipelines.prism.data import calibrate_noise, make_task
from pipelines.prism.evaluate import base_gain, make_plots, report_extra
from pipelines.prism.params import Params
from pipelines.prism.train import train_variant

NAIVE = ("naive_sgd", "naive_adam")
PAIRS = (("prism_adaptive", "ffa"), ("prism_sgd", "naive_sgd"), ("prism_adaptive", "dense"), ("prism_sgd", "dense"))


def _eps(p: Params, v: str) -> set[str]:
    return {f"test_acc_eps{float(e):g}" for e in p.methods[v].epsilons} if v in p.variants else set()


def derived(p: Params) -> list:
    """Gains in accuracy at each ε both sides ran (per seed, paired)."""
    out = [Fn(base_gain, ["base_acc", "gain.test_acc.nonprivate_vs_base"], needs_=["nonprivate"], inputs=["task"])]
    naive = set().union(*(_eps(p, v) for v in NAIVE))
    out += [Gain(k, "prism_adaptive", best_of=NAIVE, label="naive") for k in sorted(_eps(p, "prism_adaptive") & naive)]
    out += [Gain(k, a, b) for a, b in PAIRS for k in sorted(_eps(p, a) & _eps(p, b))]
    return out


SPEC = Method(
    name="prism",
    params=Params,
    data=[
        Data(make_task, "params", "task_tensors", name="task"),
        Data(calibrate_noise, ["params", "task_tensors"], "noise_json", name="noise_calibration"),
    ],
    train=Train(train_variant, ["task_tensors", "noise_json"], artifacts="json"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"task": "task_tensors", "noise": "noise_json"},
)
