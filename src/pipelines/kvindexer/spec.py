"""`kvindexer`: data.prompts → data.base_model (trained once per run, frozen) → train.<variant> (one node per
eviction policy; the learned ones train their indexer / memory inside; train.indexer_memory also times
decode of the full vs its evicted cache, interleaved side by side in one process) → evaluate; the method's
contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.kvindexer.data import make_prompts
from pipelines.kvindexer.evaluate import derived, make_plots, report_extra
from pipelines.kvindexer.params import Params
from pipelines.kvindexer.train import train_base, train_variant

SPEC = Method(
    name="kvindexer",
    params=Params,
    data=[
        Data(make_prompts, "params", ["kv_train", "kv_eval"], name="prompts"),
        Data(train_base, "params", "kv_base_model", name="base_model", tags=["gpu"]),
    ],
    train=Train(train_variant, ["kv_train", "kv_eval", "kv_base_model"], artifacts="tensors"),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
)
