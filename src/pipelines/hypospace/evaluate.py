"""Validity, Uniqueness and Recovery (paper §4, the official runners' definitions), their exact
expectations under the reference samplers, per-|A|-bin aggregates, the derived metrics of the claims,
the report's extra fields and the plots.

Per observation set with admissible set A and N queries:
- V = #valid proposals / N;
- U = #distinct keys among all *parsed* proposals / N (valid or not; an unparsed answer counts as
  neither valid nor unique);
- R = |distinct valid proposals ∩ A| / |A|.
A valid proposal outside A means the validator and the enumerator disagree (a canonicalisation bug):
that stops the run naming the set and the key, since R would be meaningless.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.hypospace.params import Params


# ----------------------------------------------------------------------------- exact expectations
def uniform_recovery_moments(K: int, N: int) -> tuple[float, float]:
    """Mean and variance of R = X/K, X = distinct values among N i.i.d. uniform draws from K."""
    if K == 1:
        return 1.0, 0.0
    a, b = (1 - 1 / K) ** N, (1 - 2 / K) ** N
    ex = K * (1 - a)
    var = K * (K - 1) * b + K * a - K * K * a * a
    return ex / K, max(var, 0.0) / K**2


def prior_validity_moments(K: int, H: int, N: int) -> tuple[float, float]:
    """Mean and variance of V = (#valid)/N, #valid ~ Binomial(N, K/|H|)."""
    q = K / H
    return q, q * (1 - q) / N


def distinct_count_pmf(K: int, N: int) -> np.ndarray:
    """P(X = j), j = 0..K, of the number X of distinct values among N i.i.d. uniform draws from K
    (occupancy recursion: a draw hits a seen value with probability j/K)."""
    pmf = np.zeros(K + 1)
    pmf[0] = 1.0
    j = np.arange(K + 1)
    for _ in range(N):
        new = pmf * j / K
        new[1:] += pmf[:-1] * (K - j[:-1]) / K
        pmf = new
    return pmf


def exact_z(observed: float, expected: float, null_samples: np.ndarray) -> float:
    """The two-sided Monte Carlo p-value of |T − E[T]| under the exact null, as the equivalent normal
    z (so "within 3 standard errors" keeps its meaning where the normal approximation fails, e.g. a
    Binomial(N, |A|/|H|) with N|A|/|H| << 1)."""
    from scipy.stats import norm

    dev = abs(observed - expected)
    if dev < 1e-12:
        return 0.0
    hits = int(np.sum(np.abs(null_samples - expected) >= dev - 1e-12))
    return float(norm.isf((1 + hits) / (len(null_samples) + 1) / 2))


N_NULL = 20_000


def recovery_null(g: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Samples of the bin mean of R under uniform sampling over A, from each set's exact pmf."""
    total = np.zeros(N_NULL)
    for K, N in zip(g["n_admissible"], g["n_queries"]):
        cdf = np.cumsum(distinct_count_pmf(int(K), int(N)))
        total += np.minimum(np.searchsorted(cdf, rng.random(N_NULL) * cdf[-1]), K) / K
    return total / len(g)


def validity_null(g: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Samples of the bin mean of V under uniform sampling over H: #valid ~ Binomial(N, |A|/|H|)."""
    total = np.zeros(N_NULL)
    for K, H, N in zip(g["n_admissible"], g["space_size"], g["n_queries"]):
        total += rng.binomial(int(N), K / H, size=N_NULL) / N
    return total / len(g)


def size_bin(n_admissible) -> np.ndarray:
    """|A| bin b = ⌊log2 |A|⌋: [1], [2, 3], [4, 7], [8, 15], ..."""
    return np.floor(np.log2(np.asarray(n_admissible, dtype=float)) + 1e-9).astype(int)


# ----------------------------------------------------------------------------- per-set metrics
def set_metrics(p: Params, variant: str, props: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per observation set of one sampler: V, U, R, parse_rate, N, |A|, |H|, bin and the exact
    expectations of the reference samplers. ``props``: the sampler's proposals; ``tables``:
    ``<domain>_obs`` and ``<domain>_admissible`` of the enabled domains."""
    obs = pd.concat([tables[f"{d}_obs"] for d in p.domains.enabled], ignore_index=True).set_index("obs_id")
    adm = pd.concat([tables[f"{d}_admissible"] for d in p.domains.enabled], ignore_index=True)
    admissible = {oid: set(g["key"]) for oid, g in adm.groupby("obs_id", sort=False)}
    rows = []
    v = variant
    for oid, g in props.groupby("obs_id", sort=False):
        o = obs.loc[oid]
        A = admissible[oid]
        N = len(g)
        parsed = g[g["parsed"]]
        valid_keys = set(g.loc[g["valid"], "key"])
        outside = valid_keys - A
        if outside:
            raise ValueError(
                f"hypospace.train.{v}: observation set {oid}: the validator "
                f"accepts {sorted(outside)[:3]} but the enumerated admissible set does not hold "
                "it (validator and enumerator disagree on the canonical key)"
            )
        K = int(o["n_admissible"])
        er, vr = uniform_recovery_moments(K, N)
        ev, vv = prior_validity_moments(K, int(o["space_size"]), N)
        rows.append(
            {
                "variant": v,
                "seed": int(o["seed"]),
                "domain": o["domain"],
                "config": o["config"],
                "obs_id": oid,
                "n_admissible": K,
                "space_size": int(o["space_size"]),
                "n_queries": N,
                "n_budget": int(g["n_budget"].iloc[0]),
                "V": g["valid"].sum() / N,
                "U": parsed["key"].nunique() / N,
                "R": len(valid_keys & A) / K,
                "parse_rate": len(parsed) / N,
                "mean_attempts": float(g["attempts"].mean()),
                "uniform_R_mean": er,
                "uniform_R_var": vr,
                "prior_V_mean": ev,
                "prior_V_var": vv,
            }
        )
    df = pd.DataFrame(rows)
    df["bin"] = size_bin(df["n_admissible"]) if len(df) else []
    return df


def gather(artifacts: dict[str, list[dict]]) -> pd.DataFrame:
    """Every sampler's per-set metrics (its artifacts) as one frame, in the variants' order."""
    frames = [pd.DataFrame(rows) for rows in artifacts.values() if rows]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def top_bins(m: pd.DataFrame, p: Params) -> dict[str, int]:
    """Per domain, the largest |A| bin holding at least ``min_bin_sets`` observation sets (over seeds)."""
    out = {}
    sets = m.drop_duplicates("obs_id")
    for d, g in sets.groupby("domain"):
        counts = g.groupby("bin").size()
        ok = counts[counts >= p.min_bin_sets]
        out[d] = int(ok.index.max() if len(ok) else counts.index.max())
    return out


def _z(mean_obs: float, mean_exp: float, var_sum: float, n: int) -> float:
    """|observed − expected| bin mean in exact standard errors (0 when both agree with zero variance)."""
    diff = abs(mean_obs - mean_exp)
    se = math.sqrt(var_sum) / n
    if se == 0:
        return 0.0 if diff < 1e-12 else math.inf
    return diff / se


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def bin_table(m: pd.DataFrame) -> pd.DataFrame:
    """Domain × sampler × |A| bin: sets, mean/std of V, U, R (pooled over seeds)."""
    g = m.groupby(["domain", "variant", "bin"])
    out = g[["V", "U", "R", "parse_rate"]].agg(["mean", "std"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
    out["n_sets"] = g.size()
    out["n_admissible_mean"] = g["n_admissible"].mean()
    out["uniform_R_expected"] = g["uniform_R_mean"].mean()
    return out.reset_index()


def _harness_z(
    artifacts: dict, p: Params, variant: str, stat: str, expect: str, stream: int, null
) -> tuple[pd.DataFrame, dict[str, float]]:
    """A sampler's rows (pooled over seeds) and the largest |z| over domain × |A| bins of the bin mean of
    ``stat`` against its exact expectation (columns ``<expect>_mean`` / ``<expect>_var``): normal, and exact
    Monte Carlo from ``null(bin rows, rng)`` (rng stream ``[*seeds, stream]``)."""
    m = gather(artifacts)
    u = m[m["variant"] == variant]
    out = {}
    zs = [
        _z(g[stat].mean(), g[f"{expect}_mean"].mean(), g[f"{expect}_var"].sum(), len(g))
        for _, g in u.groupby(["domain", "bin"])
    ]
    out[f"harness.{variant}.max_abs_z_{stat}"] = max(zs)
    rng = np.random.default_rng([*p.seeds, stream])
    out[f"harness.{variant}.max_exact_z_{stat}"] = max(
        exact_z(g[stat].mean(), g[f"{expect}_mean"].mean(), null(g, rng)) for _, g in u.groupby(["domain", "bin"])
    )
    return u, out


def harness_uniform_valid(values, p: Params, artifacts: dict) -> dict[str, float]:
    """uniform_valid against its exact expectations, pooled over seeds (point values: test statistics over
    every domain × |A| bin): the largest |z| of bin-mean R (normal and exact Monte Carlo), and the largest
    error of the identity U = R·|A|/N."""
    u, out = _harness_z(artifacts, p, "uniform_valid", "R", "uniform_R", 101, recovery_null)
    ident = (u["U"] - u["R"] * u["n_admissible"] / u["n_queries"]).abs()
    out["harness.uniform_valid.max_abs_U_identity_error"] = float(ident.max())
    return out


def harness_uniform_prior(values, p: Params, artifacts: dict) -> dict[str, float]:
    """uniform_prior: the largest |z| over domain × |A| bins of bin-mean V against |A|/|H| (pooled)."""
    return _harness_z(artifacts, p, "uniform_prior", "V", "prior_V", 102, validity_null)[1]


def collapse_names(p: Params, planned) -> list[str]:
    out = []
    for d in p.domains.enabled:
        out += [f"collapse.{d}.{k}.{v}" for v in planned for k in ("spearman_logA_R", "R_top", "U_top")]
        out.append(f"collapse.{d}.top_bin_min_size")
    return out


def collapse(values, p: Params, artifacts: dict) -> dict:
    """Per domain and sampler: Spearman(log|A|, R) over every set (seeds pooled: a point value), R and U in
    the domain's top |A| bin per seed (an interval over seeds), and the top bin's smallest |A|."""
    m = gather(artifacts)
    top = top_bins(m, p)
    out: dict = {}
    for d in p.domains.enabled:
        md = m[m["domain"] == d]
        for v in artifacts:
            g = md[md["variant"] == v]
            if g.empty:
                continue
            out[f"collapse.{d}.spearman_logA_R.{v}"] = _spearman(np.log(g["n_admissible"]), g["R"])
            t = g[g["bin"] == top[d]]
            for k in ("R", "U"):
                by_seed = {int(s): float(x) for s, x in t.groupby("seed")[k].mean().items()}
                out[f"collapse.{d}.{k}_top.{v}"] = by_seed if by_seed else float("nan")
        out[f"collapse.{d}.top_bin_min_size"] = float(2 ** top[d])
    return out


def results_table(m: pd.DataFrame, variant: str, top: dict[str, int]):
    """The long table of one sampler: per seed, V, U, R overall, per domain, per domain's top bin (``top``:
    the bins of every sampler's sets, :func:`top_bins`) and per |A| bin."""
    from pipelines.core.api import Results

    res = Results(variant)
    for seed, g in m.groupby("seed", sort=False):
        r = {
            "V": g["V"].mean(),
            "U": g["U"].mean(),
            "R": g["R"].mean(),
            "parse_rate": g["parse_rate"].mean(),
            "n_queries": float(g["n_queries"].sum()),
            "n_sets": float(len(g)),
            "n_capped_sets": float((g["n_queries"] < g["n_budget"]).sum()),
        }
        for d, gd in g.groupby("domain"):
            r.update(
                {
                    f"V_{d}": gd["V"].mean(),
                    f"U_{d}": gd["U"].mean(),
                    f"R_{d}": gd["R"].mean(),
                    f"spearman_logA_R_{d}": _spearman(np.log(gd["n_admissible"]), gd["R"]),
                }
            )
            t = gd[gd["bin"] == top[d]]
            if len(t):
                r[f"R_top_{d}"] = t["R"].mean()
            for b, gb in gd.groupby("bin"):
                r[f"R_{d}_bin{b}"] = gb["R"].mean()
                r[f"U_{d}_bin{b}"] = gb["U"].mean()
        res.add(int(seed), **r)
    return res.table()


# ----------------------------------------------------------------------------- plots
def make_plots(p: Params, values, artifacts: dict[str, list[dict]]) -> dict:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter

    metrics = gather(artifacts)
    bt = bin_table(metrics)
    figs = {}
    domains = [d for d in p.domains.enabled if d in set(bt["domain"])]
    for stat, name in (("R", "recovery_vs_admissible_size"), ("U", "uniqueness_vs_admissible_size")):
        fig, axes = plt.subplots(1, len(domains), figsize=(4.6 * len(domains), 4), squeeze=False)
        for ax, d in zip(axes[0], domains):
            bd = bt[bt["domain"] == d]
            for i, v in enumerate(p.variants):
                g = bd[bd["variant"] == v].sort_values("bin")
                if g.empty:
                    continue
                ax.errorbar(
                    g["n_admissible_mean"],
                    g[f"{stat}_mean"],
                    yerr=g[f"{stat}_std"].fillna(0),
                    marker="o",
                    ms=4,
                    capsize=2,
                    color=f"C{i}",
                    label=v,
                    alpha=0.85,
                )
            if stat == "R" and "uniform_valid" in p.variants:
                g = bd[bd["variant"] == "uniform_valid"].sort_values("bin")
                ax.plot(
                    g["n_admissible_mean"], g["uniform_R_expected"], "k--", lw=1, label="exact E[R], uniform over A"
                )
            ax.set(
                xscale="log",
                xlabel="|A| (bin mean, log scale)",
                ylabel=f"{stat} (mean ± std over sets)",
                title=d,
                ylim=(-0.03, 1.05),
            )
            ax.xaxis.set_major_locator(LogLocator(base=10))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(
            f"{'Recovery' if stat == 'R' else 'Uniqueness'} vs admissible-set size "
            f"(N = ⌈{p.protocol.query_multiplier:g}·|A|⌉)"
        )
        fig.tight_layout()
        figs[name] = fig
    # V / U / R radar per sampler (means over every observation set)
    means = (
        metrics.groupby("variant")[["V", "U", "R"]]
        .mean()
        .reindex([v for v in p.variants if v in set(metrics["variant"])])
    )
    ang = np.linspace(0, 2 * np.pi, 3, endpoint=False).tolist()
    fig = plt.figure(figsize=(7, 5))
    ax = fig.add_subplot(111, polar=True)
    for i, (v, row) in enumerate(means.iterrows()):
        vals = row.tolist()
        ax.plot(ang + ang[:1], vals + vals[:1], color=f"C{i}", label=v)
        ax.fill(ang + ang[:1], vals + vals[:1], color=f"C{i}", alpha=0.08)
    ax.set_xticks(ang, ["Validity", "Uniqueness", "Recovery"])
    ax.tick_params(axis="x", pad=14)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    ax.set_title("V / U / R per sampler (all sets)")
    fig.tight_layout()
    figs["vur_radar"] = fig
    return figs


# ----------------------------------------------------------------------------- report
def report_extra(p: Params, values, artifacts: dict) -> dict:
    metrics = gather(artifacts)
    bt = bin_table(metrics)
    return {
        "bins": bt.replace({np.nan: None}).to_dict(orient="records"),
        "top_bins": top_bins(metrics, p),
        "history_window": p.protocol.history_window,
        "query_cap": p.protocol.max_queries,
    }
