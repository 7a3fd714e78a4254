"""`featjnd`: digits canvas → backbone CNN (one shared fit, `data.backbone`) → one node per split point
(`train.estimator_<split>`: the FeatJND estimator, then E1–E3 with its fit-free controls, which share its
noise draws) → evaluate; the method's contract, built by core. The table's row variants are the maps and
allocations (`featjnd`, `gauss`, ..., `uniform_step`), their metrics prefixed by the split (`s1_acc_snr0`)."""

from pipelines.core.api import Data, Fn, Method, Train
from pipelines.featjnd.data import make_images
from pipelines.featjnd.evaluate import E1_MAPS, E3_ALLOCS, derived_metrics, derived_names, make_plots
from pipelines.featjnd.params import Params
from pipelines.featjnd.train import train_backbone, train_variant

SPEC = Method(
    name="featjnd",
    params=Params,
    data=[
        Data(make_images, "params", "images_tensors", name="make_images"),
        # shared fit: every estimator variant reads the same frozen backbone
        Data(train_backbone, ["images_tensors", "params"], "backbone_model", name="backbone", tags=["gpu"]),
    ],
    train=Train(train_variant, ["images_tensors", "backbone_model"], artifacts="tensors"),
    reports=lambda p: dict.fromkeys([*E1_MAPS, *E3_ALLOCS]),
    derived=[Fn(derived_metrics, derived_names)],
    plots=make_plots,
)
