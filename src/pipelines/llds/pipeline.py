"""`llds`: data.env → data.sft_trajectories / data.qa_test → train.base (the shared SFT policy and the
fixed probe set) → train.<variant> (GRPO with or without LLDS, one node per variant) → evaluate.plots /
evaluate.report."""
from kedro.pipeline import Pipeline, node, pipeline

from pipelines.core.registry import method_config
from pipelines.core.variants import variant_node


def create_pipeline(**kwargs) -> Pipeline:
    from pipelines.llds.data import make_env, qa_test, sft_trajectories
    from pipelines.llds.evaluate import make_plots, report
    from pipelines.llds.train import train_base, train_variant

    P = "params:llds"
    variants = method_config("llds").get("variants") or []   # this run's env + --params
    runs = {v: f"runs_{v}" for v in variants}
    return pipeline(
        [
            node(make_env, P, "env_tensors", name="data.env", tags=["data"]),
            node(sft_trajectories, ["env_tensors", P], "sft_traj_tensors", name="data.sft_trajectories",
                 tags=["data"]),
            node(qa_test, ["env_tensors", P], "qa_test_tensors", name="data.qa_test", tags=["data"]),
            node(train_base, ["env_tensors", "sft_traj_tensors", "qa_test_tensors", P],
                 ["policy_sft_model", "probe_tensors", "base_json"], name="train.base", tags=["train", "gpu"]),
            *[variant_node(train_variant, v, ["env_tensors", "qa_test_tensors", "policy_sft_model", "probe_tensors", P],
                           runs[v]) for v in variants],
            node(make_plots, {"p": P, "base": "base_json", **runs}, "plots", name="evaluate.plots", tags=["evaluate"]),
            node(report, {"p": P, "plots": "plots", "base": "base_json", **runs}, "report", name="evaluate.report",
                 tags=["evaluate"]),
        ],
        namespace="llds",
        parameters={P: P},
    )
