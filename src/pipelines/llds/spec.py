"""`llds`: data.env → data.sft_trajectories / data.qa_test → train.base (the shared SFT policy and the
fixed probe set) → train.<variant> (GRPO with or without LLDS, one node per variant) → evaluate; the
method's contract, built by core."""

from pipelines.core.api import Data, Method, Train
from pipelines.llds.data import make_env, qa_test, sft_trajectories
from pipelines.llds.evaluate import derived, make_plots, report_extra
from pipelines.llds.params import Params
from pipelines.llds.train import train_base, train_variant

SPEC = Method(
    name="llds",
    params=Params,
    data=[
        Data(make_env, "params", "env_tensors", name="env"),
        Data(sft_trajectories, ["env_tensors", "params"], "sft_traj_tensors", name="sft_trajectories"),
        Data(qa_test, ["env_tensors", "params"], "qa_test_tensors", name="qa_test"),
        Data(
            train_base,
            ["env_tensors", "sft_traj_tensors", "qa_test_tensors", "params"],
            ["policy_sft_model", "probe_tensors", "base_json"],
            name="base",
            stage="train",
        ),
    ],
    train=Train(train_variant, ["env_tensors", "qa_test_tensors", "policy_sft_model", "probe_tensors"]),
    derived=derived,
    plots=make_plots,
    extra=report_extra,
    report_inputs={"base": "base_json"},
)
