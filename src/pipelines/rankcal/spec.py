"""`rankcal`: data → train.<dataset> (every label-ranking model on one dataset, fitted and measured: the
variants ``<dataset>.<model>``), train.demo (the hierarchy counterexamples: ``demo.<predictor>``) and
train.rm_<name> (one reward model of the RLHF study) → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Method, Train
from pipelines.rankcal.data import make_datasets
from pipelines.rankcal.evaluate import (
    make_plots,
    rank_disagreement_metrics,
    rank_disagreement_names,
    report_extra,
    rlhf_metrics,
    rlhf_names,
)
from pipelines.rankcal.params import Params, node_variant
from pipelines.rankcal.train import train_variant


def variants(p: Params) -> list[str]:
    """One train node per dataset (``file:<name>`` → ``file_<name>``), the demo, and one per reward model
    of the RLHF study."""
    rms = [f"rm_{m.name}" for m in p.rlhf.models] if p.rlhf.enabled else []
    return [*(node_variant(ds) for ds in p.data.datasets), "demo", *rms]


SPEC = Method(
    name="rankcal",
    params=Params,
    data=[Data(make_datasets, "params", "datasets", name="label_rankings")],
    train=Train(train_variant, ["datasets"], artifacts="tensors"),
    variants=variants,
    derived=[Fn(rank_disagreement_metrics, rank_disagreement_names), Fn(rlhf_metrics, rlhf_names)],
    plots=make_plots,
    extra=report_extra,
)
