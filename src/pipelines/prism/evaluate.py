"""Accuracy vs ε, gauge sensitivity, noise calibration on Z; the report with the card's claims and the plots."""
import numpy as np

from pipelines.core.report import build_report
from pipelines.prism.params import Params

NAIVE = ("naive_sgd", "naive_adam")


def _eps_key(e) -> str:
    return f"{float(e):g}"


def base_accuracy(task: dict) -> float:
    from pipelines.prism.data import teacher_logits
    return 100.0 * float((teacher_logits(task["x_test"], task["base"]).argmax(1) == task["y_test"]).double().mean())


def _rows(p: Params, results: dict[str, dict]) -> list[dict]:
    rows = []
    main = p.privacy.main_epsilon
    for v, res in results.items():
        for seed in sorted({r["seed"] for r in res["runs"]}):
            runs = [r for r in res["runs"] if r["seed"] == seed]
            row = {"variant": v, "seed": seed}
            for r in runs:
                if r["gauge"] == "s1" and r["epsilon"] is not None:
                    row[f"test_acc_eps{_eps_key(r['epsilon'])}"] = r["test_acc"]
            main_run = next((r for r in runs if r["gauge"] == "s1" and r["epsilon"] in (None, main)), runs[0])
            row["test_acc"] = main_run["test_acc"]
            for k in ("train_loss", "step_time_s", "clip_fraction", "noise_z_fro_measured", "noise_factor_fro",
                      "noise_z_fro_closed_form", "sigma_min_S", "sigma", "epsilon_spent"):
                if main_run.get(k) is not None:
                    row[k] = main_run[k]
            if "noise_z_fro_closed_form" in row:
                row["noise_z_ratio"] = row["noise_z_fro_measured"] / row["noise_z_fro_closed_form"]
            gauges = {r["gauge"]: r["test_acc"] for r in runs if r["epsilon"] == main}
            if len(gauges) > 1:
                for g, a in gauges.items():
                    row[f"test_acc_gauge_{g}"] = a
                for r in runs:
                    if r["epsilon"] == main and "noise_z_fro_measured" in r:
                        row[f"noise_z_fro_gauge_{r['gauge']}"] = r["noise_z_fro_measured"]
                row["gauge_spread_acc"] = max(gauges.values()) - min(gauges.values())
            rows.append(row)
    return rows


def _mean(rows, v, k):
    vals = [r[k] for r in rows if r["variant"] == v and k in r]
    return float(np.mean(vals)) if vals else None


def derived(p: Params, rows: list[dict], base_acc: float) -> dict:
    out = {"base_acc": base_acc}
    np_acc = _mean(rows, "nonprivate", "test_acc")
    if np_acc is not None:
        out["gain.test_acc.nonprivate_vs_base"] = np_acc - base_acc
    eps = sorted({k for r in rows for k in r if k.startswith("test_acc_eps")})
    for k in eps:
        pa = _mean(rows, "prism_adaptive", k)
        naive = [x for x in (_mean(rows, v, k) for v in NAIVE) if x is not None]
        if pa is not None and naive:
            out[f"gain.{k}.prism_adaptive_vs_best_naive"] = pa - max(naive)
        for a, b in (("prism_adaptive", "ffa"), ("prism_sgd", "naive_sgd"), ("prism_adaptive", "dense"),
                     ("prism_sgd", "dense")):
            va, vb = _mean(rows, a, k), _mean(rows, b, k)
            if va is not None and vb is not None:
                out[f"gain.{k}.{a}_vs_{b}"] = va - vb
    return out


def make_plots(p: Params, task: dict, **results: dict) -> dict:
    import matplotlib.pyplot as plt

    rows = _rows(p, results)
    figs = {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in results:
        ks = sorted({k for r in rows if r["variant"] == v for k in r if k.startswith("test_acc_eps")},
                    key=lambda k: float(k[len("test_acc_eps"):]))
        if not ks:
            ax.axhline(_mean(rows, v, "test_acc"), ls="--", color="k", label=f"{v} (ε=∞)")
            continue
        xs = [float(k[len("test_acc_eps"):]) for k in ks]
        ax.plot(xs, [_mean(rows, v, k) for k in ks], marker="o", label=v)
    ax.axhline(base_accuracy(task), ls=":", color="gray", label="base model")
    ax.set(xscale="log", xlabel="ε (δ = %g)" % p.privacy.delta, ylabel="test accuracy (%)", title="accuracy vs ε")
    grid = sorted({float(k[len("test_acc_eps"):]) for r in rows for k in r if k.startswith("test_acc_eps")})
    ax.set_xticks(grid, [f"{e:g}" for e in grid])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["accuracy_vs_epsilon"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in results:
        gk = sorted({k for r in rows if r["variant"] == v for k in r if k.startswith("test_acc_gauge_")})
        if gk:
            ax.plot([k[len("test_acc_gauge_"):] for k in gk], [_mean(rows, v, k) for k in gk], marker="o", label=v)
    ax.set(xlabel="gauge G", ylabel="test accuracy (%)", title=f"gauge sensitivity at ε = {p.privacy.main_epsilon:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    figs["accuracy_vs_gauge"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    for v, res in results.items():
        for r in res["runs"]:
            if (r.get("noise_norms") and r["epsilon"] == p.privacy.main_epsilon and r["seed"] == p.seeds[0]
                    and (r["gauge"] == "s1" or res["mechanism"] == "naive")):
                ax.hist(np.log10(r["noise_norms"]), bins=40, alpha=0.5, label=f"{v} [{r['gauge']}]")
                if r.get("noise_z_fro_closed_form"):
                    ax.axvline(np.log10(r["noise_z_fro_closed_form"]), color="k", ls="--")
    ax.set(xlabel="log10 ‖noise on Z‖_F per step, first order (dashed: PRISM's σC√d_T / b)",
           ylabel="steps", title=f"noise reaching Z at ε = {p.privacy.main_epsilon:g}")
    ax.legend(fontsize=6)
    fig.tight_layout()
    figs["noise_norms_on_z"] = fig
    return figs


def report(p: Params, task: dict, noise: dict, plots: dict, **results: dict) -> dict:
    rows = _rows(p, results)
    metrics = derived(p, rows, base_accuracy(task))
    histories = {}
    for v, res in results.items():
        r0 = next(r for r in res["runs"] if r["seed"] == p.seeds[0] and r["gauge"] == "s1"
                  and r["epsilon"] in (None, p.privacy.main_epsilon))
        h = {"train_loss": {"step": list(range(0, 10 * len(r0["loss_history"]), 10)), "value": r0["loss_history"]}}
        if r0.get("sigma_min_S_history"):
            h["sigma_min_S"] = {"step": list(range(0, 10 * len(r0["sigma_min_S_history"]), 10)),
                                "value": r0["sigma_min_S_history"]}
        histories[v] = h
    extra = {"privacy": {"steps": noise["steps"], "sample_rate": noise["sample_rate"], "delta": noise["delta"],
                         "sigma_by_epsilon": noise["sigma"]},
             "task": {"flip_frac": float(task["flip_frac"]), "perturbation_scale": float(task["alpha"])}}
    return build_report("prism", p, rows, metrics, artifacts=plots, extra=extra, histories=histories)
