"""`wbmm`: data (benchmark grid, images) → one ``train.<variant>`` node per tiny-net variant, and the two
interleaved speed benchmarks (``train.operator_speed``: every op's row; ``train.train_speed``: the nets'
training step), each one node because what it compares must run side by side in one process → evaluate;
the method's contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.wbmm.data import make_grid, make_images
from pipelines.wbmm.evaluate import derived, make_plots, report_extra
from pipelines.wbmm.params import Params
from pipelines.wbmm.train import planned, train_variant, variant_inputs

SPEC = Method(
    name="wbmm",
    params=Params,
    data=[
        Data(make_grid, "params", "bench_grid", name="bench_grid"),
        Data(make_images, "params", "images_tensors", name="images"),
    ],
    # artifacts: the nets' state dicts; the benchmarks' per-round samples (what the intervals are built from)
    train=Train(train_variant, variant_inputs, artifacts="tensors"),
    variants=planned,
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"bench": "operator_speed_artifacts_tensors", "speed": "train_speed_artifacts_tensors"},
)
