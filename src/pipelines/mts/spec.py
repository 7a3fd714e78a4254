"""`mts`: data.pool → data.features (offline SD_* / pre_* features) → data.gsnr (the meta-gradient GSNR vs
batch size at a fixed early point) → train.<variant> (baselines and the meta-learned selectors, every seed)
→ evaluate; declared here, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.mts.data import make_pool
from pipelines.mts.evaluate import derived, make_plots
from pipelines.mts.gsnr import measure_gsnr
from pipelines.mts.params import Params
from pipelines.mts.train import make_features, train_variant

SPEC = Method(
    name="mts",
    params=Params,
    data=[
        Data(make_pool, "params", "pool", name="pool"),
        Data(make_features, ["pool", "params"], "features", name="features"),
        Data(measure_gsnr, ["pool", "features", "params"], "gsnr", name="gsnr"),
    ],
    train=Train(train_variant, ["pool", "features"], artifacts="json"),
    derived=derived,
    plots=make_plots,
    report_inputs=["gsnr"],
)
