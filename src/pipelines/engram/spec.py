"""`engram`: data.dataset (digits, split per seed) → data.original (the MLP every edit starts from) →
data.covariances (the original model's per-class layer statistics) → train.original (its metrics) and one
``train.<variant>`` per edit variant → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Diff, Fn, Method, Ratio, Train
from pipelines.engram.data import make_dataset
from pipelines.engram.evaluate import (
    ITERATIVE,
    common_metrics,
    common_names,
    fastest_iterative_speedup,
    fastest_names,
    make_plots,
    report_extra,
)
from pipelines.engram.params import Params
from pipelines.engram.train import covariances, train_original, train_variant


def variants(p: Params) -> list[str]:
    """``original`` (the model every edit starts from) and the edit variants."""
    return ["original", *p.variants]


def derived(p: Params) -> list:
    """Edit-time speed-ups over each iterative variant and over the fastest, the random-edit control, and
    the comparisons on the classes every variant forgot (all per seed, paired)."""
    return [
        *(Ratio("edit_time_s", v, "engram", name=f"speedup.edit_time.engram_vs_{v}") for v in ITERATIVE),
        Fn(fastest_iterative_speedup, fastest_names, needs_=["engram"]),
        Diff("forget_acc", "random_edit", "engram", name="control.forget_acc.random_edit_minus_engram"),
        Fn(common_metrics, common_names),
    ]


SPEC = Method(
    name="engram",
    params=Params,
    data=[
        Data(make_dataset, "params", "digits_tensors", name="dataset"),
        Data(train_original, ["digits_tensors", "params"], "original_model", name="original", tags=["train", "gpu"]),
        Data(covariances, ["digits_tensors", "original_model", "params"], "covariances_tensors", name="covariances"),
    ],
    train=Train(train_variant, ["digits_tensors", "original_model", "covariances_tensors"], artifacts="json"),
    variants=variants,
    derived=derived,
    plots=make_plots,
    extra=report_extra,
)
