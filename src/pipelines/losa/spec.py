"""`losa`: data.tasks → data.bdlm (the one base block-diffusion LM of a run) → train.<variant> (one node per
prefix-attention policy: dense, quest, sparsed, losa and its ablations; each decodes every eval seed and
budget with the base model) → data.timing (dense / Quest / LoSA attention time, interleaved side by side in
one process) → evaluate; the method's contract, built by core."""

from pipelines.core.api import Data, Fn, Method, Train
from pipelines.losa import evaluate as E
from pipelines.losa.bench import measure_timing
from pipelines.losa.data import make_tasks
from pipelines.losa.params import Params
from pipelines.losa.train import decode_variant, train_base


def variants(p: Params) -> list[str]:
    return [v.name for v in p.variants]


def produces(p: Params, name: str) -> list[str]:
    """The metrics variant ``name``'s table can hold: dense's unsuffixed, the others' per budget it decodes."""
    v = p.variant(name)
    if v.kind == "dense":
        return list(E.METRICS)
    return [f"{m}_b{b}" for b in p.budgets_of(v) for m in E.METRICS]


def comparison_names(p: Params, planned) -> list[str]:
    """What :func:`evaluate.derived_metrics` produces for the planned variants."""
    vs = [p.variant(n) for n in planned]
    dense = next(v.name for v in vs if v.kind == "dense")
    sparse = [v for v in vs if v.kind != "dense"]
    out = ["dense_answer_em"]
    for q in (v for v in vs if v.kind == "quest"):
        for v in sparse:
            if v.name == q.name:
                continue
            common = sorted(set(p.budgets_of(v)) & set(p.budgets_of(q)))
            for b in common:
                out += [f"density_ratio.{v.name}_vs_{q.name}.b{b}", f"err_ratio.{q.name}_vs_{v.name}.b{b}"]
            if common:
                out += [
                    f"density_ratio.{v.name}_vs_{q.name}.min",
                    f"density_ratio.{v.name}_vs_{q.name}.max",
                    f"err_ratio.{q.name}_vs_{v.name}.min",
                ]
            out += [f"matched_density_err_ratio.{q.name}_vs_{v.name}.b{b}" for b in p.budgets_of(v)]
    for v in sparse:
        for b in p.budgets_of(v):
            out.append(f"gated.answer_em_gap.{v.name}_minus_{dense}.b{b}")
            out += [
                f"gated.answer_em_gap.{v.name}_minus_{w.name}.b{b}"
                for w in sparse
                if w.name != v.name and v.kind == "losa" and w.kind in ("sparsed", "quest") and b in p.budgets_of(w)
            ]
    return out


def agreement_names(p: Params, planned) -> list[str]:
    return [f"token_agreement_vs_dense.{n}.b{b}" for n in planned for b in p.budgets_of(p.variant(n))]


def timing_names(p: Params, planned) -> list[str]:
    """The timing ratios the claims may read (the per-policy medians are named by the device at run time)."""
    kinds = {p.variant(n).kind for n in planned}
    out = ["base_model.final_loss", "base_model.final_masked_acc"]
    for b in p.timing.budgets:
        if "losa" in kinds:
            out.append(f"speedup.attn_ms.losa_vs_dense.b{b}")
        if "quest" in kinds:
            out.append(f"speedup.attn_ms.quest_vs_dense.b{b}")
        if {"losa", "quest"} <= kinds:
            out.append(f"speedup.attn_ms.losa_vs_quest.b{b}")
    return out


SPEC = Method(
    name="losa",
    params=Params,
    data=[
        Data(make_tasks, "params", "tasks_tensors", name="tasks"),
        Data(train_base, ["tasks_tensors", "params"], "bdlm_model", name="bdlm", tags=["gpu"]),
        Data(
            measure_timing,
            ["tasks_tensors", "bdlm_model", "params"],
            "timing_json",
            name="timing",
            tags=["evaluate", "gpu"],
        ),
    ],
    train=Train(decode_variant, ["tasks_tensors", "bdlm_model"], artifacts="json"),
    variants=variants,
    produces=produces,
    derived=[
        Fn(E.per_seed_comparisons, comparison_names),
        Fn(E.token_agreement, agreement_names, inputs=["artifacts"]),
        Fn(E.timing_metrics, timing_names, inputs=["timing", "bdlm"]),
    ],
    plots=E.make_plots,
    extra=E.report_extra,
    report_inputs={"timing": "timing_json", "bdlm": "bdlm_model"},
)
