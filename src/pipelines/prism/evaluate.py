"""Accuracy vs ε, gauge sensitivity, noise calibration on Z; the report with the card's claims and the plots."""

import numpy as np

from pipelines.prism.params import Params

NAIVE = ("naive_sgd", "naive_adam")


def _eps_key(e) -> str:
    return f"{float(e):g}"


def base_accuracy(task: dict) -> float:
    from pipelines.prism.data import teacher_logits

    return 100.0 * float((teacher_logits(task["x_test"], task["base"]).argmax(1) == task["y_test"]).double().mean())


def base_gain(values, p: Params, task: dict) -> dict:
    """Non-private LoRA's gain over the public base model, per seed (the task is learnable at all)."""
    base = base_accuracy(task)
    return {
        "base_acc": base,
        "gain.test_acc.nonprivate_vs_base": {s: a - base for s, a in values.per_seed("nonprivate", "test_acc").items()},
    }


def _eps_metrics(values, v: str) -> list[str]:
    return sorted(
        (k for k in values.metrics(v) if k.startswith("test_acc_eps")), key=lambda k: float(k[len("test_acc_eps") :])
    )


def make_plots(p: Params, values, results: dict[str, dict], task: dict) -> dict:
    import matplotlib.pyplot as plt

    figs = {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in results:
        ks = _eps_metrics(values, v)
        if not ks:
            ax.axhline(values.mean(v, "test_acc"), ls="--", color="k", label=f"{v} (ε=∞)")
            continue
        xs = [float(k[len("test_acc_eps") :]) for k in ks]
        ax.plot(xs, [values.mean(v, k) for k in ks], marker="o", label=v)
    ax.axhline(base_accuracy(task), ls=":", color="gray", label="base model")
    ax.set(xscale="log", xlabel="ε (δ = %g)" % p.privacy.delta, ylabel="test accuracy (%)", title="accuracy vs ε")
    grid = sorted({float(k[len("test_acc_eps") :]) for v in results for k in _eps_metrics(values, v)})
    ax.set_xticks(grid, [f"{e:g}" for e in grid])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["accuracy_vs_epsilon"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in results:
        gk = sorted(k for k in values.metrics(v) if k.startswith("test_acc_gauge_"))
        if gk:
            ax.plot([k[len("test_acc_gauge_") :] for k in gk], [values.mean(v, k) for k in gk], marker="o", label=v)
    ax.set(xlabel="gauge G", ylabel="test accuracy (%)", title=f"gauge sensitivity at ε = {p.privacy.main_epsilon:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    figs["accuracy_vs_gauge"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    for v, res in results.items():
        for r in res["runs"]:
            if (
                r.get("noise_norms")
                and r["epsilon"] == p.privacy.main_epsilon
                and r["seed"] == p.seeds[0]
                and (r["gauge"] == "s1" or res["mechanism"] == "naive")
            ):
                ax.hist(np.log10(r["noise_norms"]), bins=40, alpha=0.5, label=f"{v} [{r['gauge']}]")
                if r.get("noise_z_fro_closed_form"):
                    ax.axvline(np.log10(r["noise_z_fro_closed_form"]), color="k", ls="--")
    ax.set(
        xlabel="log10 ‖noise on Z‖_F per step, first order (dashed: PRISM's σC√d_T / b)",
        ylabel="steps",
        title=f"noise reaching Z at ε = {p.privacy.main_epsilon:g}",
    )
    ax.legend(fontsize=6)
    fig.tight_layout()
    figs["noise_norms_on_z"] = fig
    return figs


def report_extra(p: Params, values, results: dict[str, dict], noise: dict, task: dict) -> dict:
    return {
        "privacy": {
            "steps": noise["steps"],
            "sample_rate": noise["sample_rate"],
            "delta": noise["delta"],
            "sigma_by_epsilon": noise["sigma"],
        },
        "task": {"flip_frac": float(task["flip_frac"]), "perturbation_scale": float(task["alpha"])},
    }
