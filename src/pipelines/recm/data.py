"""`recm_advdiff`: 1-D periodic advection–diffusion with a symmetry-breaking knob ε (the small-scale
task), the user-table loader of the full env, and the measurable data-level symmetry gap (best circulant
vs best dense linear predictor)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema, read_user_file
from pipelines.recm.params import Params

# a user table (--env=full): one row per (ε, sample), arrays of length L
USER_TABLE = TableSchema(
    "recm.user_data",
    {"eps": "number", "split": "str", "u_prev": "array", "u_now": "array", "u_next": "array"},
    min_rows=2,
    no_missing=("eps", "split"),
)


def eps_tag(eps: float) -> str:
    """A metric-name-safe tag for ε: 0.2 → ``eps0p2`` (a dot would read as a key separator)."""
    return "eps" + f"{float(eps):g}".replace(".", "p").replace("-", "m")


def coefficients(L: int, eps: float, c0: float, nu0: float) -> tuple[np.ndarray, np.ndarray]:
    """c(x) = c0 (1 + ε sin 2πx/L), ν(x) = ν0 (1 + ε cos 2πx/L) on the grid x = 0..L-1."""
    x = np.arange(L)
    return c0 * (1 + eps * np.sin(2 * np.pi * x / L)), nu0 * (1 + eps * np.cos(2 * np.pi * x / L))


def advdiff_step(u: np.ndarray, c: np.ndarray, nu: np.ndarray, dt: float, substeps: int) -> np.ndarray:
    """u_t + c(x) u_x = ν(x) u_xx over Δt: explicit periodic finite differences (dx = 1), upwind advection
    (c may change sign when ε > 1), central diffusion, ``substeps`` Euler steps."""
    h = dt / substeps
    for _ in range(substeps):
        up, um = np.roll(u, -1, axis=-1), np.roll(u, 1, axis=-1)
        ux = np.where(c >= 0, u - um, up - u)
        u = u + h * (-c * ux + nu * (up - 2 * u + um))
    return u


def check_stable(p: Params) -> None:
    d = p.data
    h = d.dt / d.substeps
    cmax, numax = d.c0 * (1 + max(d.eps)), d.nu0 * (1 + max(d.eps))
    if h * (cmax + 2 * numax) > 1.0:
        raise ValueError(
            f"parameter recm.data.substeps: explicit scheme unstable (Δt/substeps · (c_max + 2ν_max) = "
            f"{h * (cmax + 2 * numax):.3g} > 1); raise substeps"
        )


def simulate(L: int, n: int, eps: float, p: Params, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(u_{t−Δt}, u_t, u_{t+Δt}) for n seeded initial states, each a sum of random Fourier modes."""
    d = p.data
    x = np.arange(L)
    k = rng.integers(1, d.max_wavenumber + 1, size=(n, d.n_modes, 1))
    a = rng.normal(size=(n, d.n_modes, 1))
    phi = rng.uniform(0, 2 * np.pi, size=(n, d.n_modes, 1))
    u0 = (a * np.sin(2 * np.pi * k * x / L + phi)).sum(1)
    c, nu = coefficients(L, eps, d.c0, d.nu0)
    u1 = advdiff_step(u0, c, nu, d.dt, d.substeps)
    u2 = advdiff_step(u1, c, nu, d.dt, d.substeps)
    return u0, u1, u2


def make_data(p: Params) -> pd.DataFrame:
    """One row per (ε, split, sample) with array columns u_prev, u_now, u_next (the node ``data.advdiff``);
    the same initial states for every ε (a common random stream), so ε is the only thing that changes."""
    d = p.data
    if d.path:
        return load_user_data(d.path, p)
    check_stable(p)
    frames = []
    for eps in d.eps:
        rng = np.random.default_rng(d.seed)
        for split, n in (("train", d.n_train), ("test", d.n_test)):
            u0, u1, u2 = simulate(d.L, n, eps, p, rng)
            frames.append(
                pd.DataFrame(
                    {"eps": float(eps), "split": split, "u_prev": list(u0), "u_now": list(u1), "u_next": list(u2)}
                )
            )
    return pd.concat(frames, ignore_index=True)


def load_user_data(path: str, p: Params) -> pd.DataFrame:
    """A user's parquet table (README: columns eps, split, u_prev, u_now, u_next), checked at the door."""
    df = read_user_file(path, key="recm.data.path", schema=USER_TABLE, kind="parquet")
    return check_table(df, p)


def check_table(df: pd.DataFrame, p: Params) -> pd.DataFrame:
    """Every listed ε has train and test rows; arrays all of length data.L."""
    USER_TABLE.check(df)
    bad_split = set(df["split"]) - {"train", "test"}
    if bad_split:
        raise _table_error(f"column 'split' has values {sorted(bad_split)} (train / test only)")
    for col in ("u_prev", "u_now", "u_next"):
        lens = df[col].map(len)
        if (lens != p.data.L).any():
            raise _table_error(
                f"column '{col}' has arrays of length {int(lens[lens != p.data.L].iloc[0])}, "
                f"expected data.L = {p.data.L}"
            )
    for eps in p.data.eps:
        for split in ("train", "test"):
            if not ((np.isclose(df["eps"], eps)) & (df["split"] == split)).any():
                raise _table_error(f"column 'eps' has no {split} rows for ε = {eps} (data.eps lists it)")
    return df


def _table_error(msg: str):
    from pipelines.core.api import InputDataError

    return InputDataError(f"dataset '{USER_TABLE.dataset}': {msg}")


def arrays(df: pd.DataFrame, eps: float, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, 2, L) = (u_t, u_{t−Δt}) and targets (n, L) of one ε and split."""
    d = df[np.isclose(df["eps"].to_numpy(float), eps) & (df["split"] == split)]
    x = np.stack([np.stack(d["u_now"].to_numpy()), np.stack(d["u_prev"].to_numpy())], axis=1)
    return x.astype(np.float64), np.stack(d["u_next"].to_numpy()).astype(np.float64)


# --------------------------------------------------------------------------- the data-level symmetry gap
def _lstsq_fit(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with an intercept, in float64 through torch (whose thread count the node preamble
    set; NumPy's BLAS would pick its own)."""
    import torch

    A1 = torch.from_numpy(np.concatenate([A, np.ones((len(A), 1))], axis=1))
    rhs = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float64))
    sol = torch.linalg.lstsq(A1, rhs if rhs.ndim == 2 else rhs[:, None], driver="gelsd").solution
    return sol.numpy() if b.ndim == 2 else sol[:, 0].numpy()


def _lstsq_apply(A: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.concatenate([A, np.ones((len(A), 1))], axis=1) @ w


REL_PRECISION = 1e-12


def circulant_features(x: np.ndarray) -> np.ndarray:
    """Rows (sample, position i) with features x_c[(i + d) mod L] for every channel c and offset d: the
    design matrix of the most general shift-equivariant linear map (plus a shared bias)."""
    n, C, L = x.shape
    idx = (np.arange(L)[:, None] + np.arange(L)[None, :]) % L  # (i, d)
    return x[:, :, idx].transpose(0, 2, 1, 3).reshape(n * L, C * L)  # (n·L, C·L)


def symmetry_gap_linear(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray) -> dict[str, float]:
    """(test MSE of the best circulant linear predictor − that of the best dense one) / var(y_test),
    clipped at 0 (a dense fit that only overfits more cannot make an exactly symmetric task asymmetric);
    differences below ``REL_PRECISION`` are rounding (two exact fits) and read as 0."""
    n, C, L = x_tr.shape
    w_c = _lstsq_fit(circulant_features(x_tr), y_tr.reshape(-1))
    pred_c = _lstsq_apply(circulant_features(x_te), w_c).reshape(len(x_te), L)
    w_d = _lstsq_fit(x_tr.reshape(n, -1), y_tr)
    pred_d = _lstsq_apply(x_te.reshape(len(x_te), -1), w_d)
    var = float(y_te.var())
    mse_c, mse_d = float(((pred_c - y_te) ** 2).mean()), float(((pred_d - y_te) ** 2).mean())
    gap = (mse_c - mse_d) / var
    return {
        "symmetry_gap_linear": gap if gap > REL_PRECISION else 0.0,
        "linear_circulant_rel_mse": mse_c / var,
        "linear_dense_rel_mse": mse_d / var,
    }
