"""`bimu`: data.streams → train.<variant> (continual bimu / bayesbinn / bayesbinn_official / online / mesu /
ste_adam / metaplastic on the permuted-digit stream; active al_vr / al_entropy / al_epistemic / al_random /
al_all on the imbalanced stream) → evaluate; the method's contract, built by core."""

from pipelines.bimu.data import make_streams
from pipelines.bimu.evaluate import derived, make_plots, report_extra
from pipelines.bimu.params import Params
from pipelines.bimu.train import train_variant
from pipelines.core.api import Data, Method, Train

SPEC = Method(
    name="bimu",
    params=Params,
    data=[Data(make_streams, "params", "streams_tensors", name="streams")],
    train=Train(train_variant, ["streams_tensors"], artifacts="tensors"),
    derived=derived(),
    plots=make_plots,
    extra=report_extra,
)
