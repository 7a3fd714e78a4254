"""`softtorch`: data.digit_sequences and data.speed (the interleaved timing of every sort method, one node)
→ train.<method> (one node per relaxation method: accuracy vs softness, toys, digit sorting) → evaluate;
the method's contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.softtorch.data import make_digit_sequences
from pipelines.softtorch.evaluate import DERIVED, make_plots
from pipelines.softtorch.params import Params
from pipelines.softtorch.speed import speed_benchmark
from pipelines.softtorch.train import train_variant

SPEC = Method(
    name="softtorch",
    params=Params,
    data=[
        Data(make_digit_sequences, "params", "digits_tensors", name="digit_sequences"),
        Data(speed_benchmark, "params", "speed", name="speed"),
    ],
    train=Train(train_variant, ["digits_tensors"]),
    derived=DERIVED,
    plots=make_plots,
    report_inputs=["speed"],
)
