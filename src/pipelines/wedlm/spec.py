"""`wedlm`: data.tasks → train.wedlm (every trained model — `wedlm`, and `ar_only` when
`train.ar_only_seeds` is set — trained, decoding the test set, and the decoders' wall clock interleaved side
by side in the same process) → evaluate; the method's contract, built by core. The table's row variants are
the decoders: `ar`, `wedlm`, `wedlm_fast`, `blockwise` (the `wedlm` weights) and `ar_only`."""

from pipelines.core.api import Data, Diff, Fn, Method, Ratio, Train
from pipelines.wedlm.data import make_tasks
from pipelines.wedlm.evaluate import (
    WEDLM_VARIANTS,
    make_plots,
    max_wedlm,
    max_wedlm_names,
    report_extra,
    speed_ratio_names,
    speed_ratios,
)
from pipelines.wedlm.params import Params
from pipelines.wedlm.train import train_variant


def derived(p: Params) -> list:
    """Per seed, paired: exact match against AR decoding of the same weights, the tokens-per-forward ratios;
    the fastest WeDLM decoder; the wall-clock ratios (their own interval over the timing rounds)."""
    out = [
        Diff(f"exact_match_{r}", v, "ar", name=f"delta.exact_match_{r}.{v}_minus_ar")
        for r in p.data.regimes
        for v in WEDLM_VARIANTS
    ]
    for r in p.data.regimes:
        out += [
            Ratio(f"tokens_per_forward_{r}", "wedlm_fast", b, name=f"ratio.tokens_per_forward_{r}.wedlm_fast_vs_{b}")
            for b in ("wedlm", "blockwise")
        ]
    return [*out, Fn(max_wedlm, max_wedlm_names), Fn(speed_ratios, speed_ratio_names)]


def reports(p: Params) -> list[str]:
    return ["ar", *WEDLM_VARIANTS, *(["ar_only"] if p.train.ar_only_seeds else [])]


SPEC = Method(
    name="wedlm",
    params=Params,
    data=[Data(make_tasks, "params", ["test", "tasks_tensors"], name="tasks")],
    train=Train(train_variant, ["tasks_tensors", "test"], artifacts="tensors"),
    variants=lambda p: ["wedlm"],
    reports=reports,
    derived=derived,
    plots=make_plots,
    extra=report_extra,
)
