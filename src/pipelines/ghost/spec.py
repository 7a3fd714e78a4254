"""`ghost`: data.corpus → data.mamba2_tiny (the SSM LM, trained ONCE per run and cached) → one
``train.<variant>`` per pruning method (scores, pruning over the ratio grid, test perplexity) →
data.loo_oracle / data.decode_timing (one node: the decode speeds are interleaved side by side) →
evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Method, Ratio, Train
from pipelines.ghost import evaluate as E
from pipelines.ghost.data import make_corpus
from pipelines.ghost.params import Params
from pipelines.ghost.train import prune_variant, train_model

METRICS = ("test_ppl", "delta_ppl", "calib_time_s", "state_bytes_per_seq", "kept_fraction")


def variants(p: Params) -> list[str]:
    return p.variants


def produces(p: Params, v: str) -> list[str]:
    """The metrics of variant ``v``'s table: dense's unsuffixed, the others' per ratio it runs."""
    extra = ("mqar_acc",) if p.data.kind == "markov_mqar" else ()
    if v == "dense":
        return [*METRICS, *extra]
    return [f"{k}_{E.rho_key(r)}" for r in E.all_rhos(p) for k in (*METRICS, "top_half_mass_min", *extra)]


def derived(p: Params) -> list:
    """GHOST's Δppl over each baseline's (per seed, paired) and the margins the claims read, the rank
    correlation with the leave-one-out oracle, the heavy tail, the calibration and decode speed-ups."""
    ratios = [
        Ratio(f"delta_ppl_{E.rho_key(r)}", "ghost", b, name=f"ratio.delta_ppl_{E.rho_key(r)}.ghost_vs_{b}")
        for r in E.all_rhos(p)
        for b in E.BASELINES
    ]
    return [
        *ratios,
        Fn(E.margins, E.margin_names, needs_=["ghost"]),
        Fn(E.rank_correlations, E.spearman_names, inputs=["loo", "artifacts"]),
        Fn(E.heavy_tail, ["heavy_tail.ghost_top_half_mass_min"], needs_=["ghost"]),
        Fn(E.calib_speedup, E.calib_names, needs_=["ghost"]),
        Fn(E.decode_metrics, E.decode_names, inputs=["timing"]),
        Fn(E.model_metrics, ["dense_val_nll", "train_final_loss"], inputs=["model_blob"]),
        Fn(E.dense_ppl_over_vocab, ["dense_ppl_over_vocab"], needs_=["dense"]),
    ]


SPEC = Method(
    name="ghost",
    params=Params,
    data=[
        Data(make_corpus, "params", "corpus_tensors", name="corpus"),
        Data(train_model, ["corpus_tensors", "params"], "mamba2_tiny_model", name="mamba2_tiny", tags=["gpu"]),
        Data(
            E.loo_oracle,
            ["corpus_tensors", "mamba2_tiny_model", "params"],
            "loo_tensors",
            name="loo_oracle",
            tags=["evaluate"],
        ),
        Data(
            E.decode_timing,
            ["corpus_tensors", "mamba2_tiny_model", "ghost_artifacts_tensors", "params"],
            "timing_json",
            name="decode_timing",
            tags=["evaluate"],
        ),
    ],
    train=Train(prune_variant, ["corpus_tensors", "mamba2_tiny_model"], artifacts="tensors"),
    variants=variants,
    derived=derived,
    produces=produces,
    plots=E.make_plots,
    extra=E.report_extra,
    report_inputs={"model_blob": "mamba2_tiny_model", "loo": "loo_tensors", "timing": "timing_json"},
)
