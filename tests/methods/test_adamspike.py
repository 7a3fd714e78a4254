"""Tests of `adamspike`: the mechanism against independent references (numpy eigvals of D·A on a quadratic,
a plain float64 Adam recursion, torch's Adam, torch double-backward HVPs, brute-force alarm scoring) and bad
input. The end-to-end --env=test run is covered for every pipeline by tests/methods/test_all_pipelines.py."""

import math

import numpy as np
import pandas as pd
import pytest

from pipelines.adamspike.params import Params
from pipelines.core.params import ParameterError, validate

CONFIGS = {
    "quad_adam": {"model": "quad", "beta1": 0.0, "beta2": 0.99, "eps": 0.0},
    "mlp_adam": {"model": "mlp", "beta1": 0.9, "beta2": 0.999},
}
RAW = {"seeds": [0], "configs": CONFIGS, "variants": ["quad_adam", "mlp_adam"], "headline_variants": ["mlp_adam"]}


def _adam_reference(a_mat, theta0, lr, beta1, beta2, eps, steps):
    """Plain float64 Adam on ½θᵀAθ, written out: per step θ_t, g_t, v̂_t, u_t."""
    theta, m, v = theta0.copy(), np.zeros_like(theta0), np.zeros_like(theta0)
    out = []
    for t in range(1, steps + 1):
        g = a_mat @ theta
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mhat, vhat = m / (1 - beta1**t), v / (1 - beta2**t)
        u = mhat / (np.sqrt(vhat) + eps)
        out.append((theta.copy(), g, vhat, u))
        theta = theta - lr * u
    return out


class _QuadModule:
    """½θᵀAθ as a torch module for core's training loop."""

    @staticmethod
    def make(a_mat, theta0):
        import torch

        class Quad(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.theta = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
                self.register_buffer("a", torch.tensor(a_mat, dtype=torch.float64))

            def loss(self):
                return 0.5 * self.theta @ self.a @ self.theta

        return Quad()


def _track_quadratic(a_mat, theta0, lr, beta1, beta2, eps, steps, power_iters):
    """Run the pipeline's Tracker on ½θᵀAθ through core.training.fit (Adam built by the tracker)."""
    from pipelines.adamspike.model import QuadraticCurvature
    from pipelines.adamspike.train import Tracker
    from pipelines.core.training import fit

    cfg = {"model": "mlp", "beta1": beta1, "beta2": beta2, "eps": eps}
    p = Params.model_validate(
        {
            **RAW,
            "configs": {**CONFIGS, "q": cfg},
            "variants": ["q"],
            "headline_variants": [],
            "tracking": {"power_iters": power_iters, "raw_power_iters": power_iters},
        }
    )
    model = _QuadModule.make(a_mat, theta0)
    tracker = Tracker(model, QuadraticCurvature(a_mat), p.configs["q"], p, 0, lr, steps)
    fit(
        model,
        None,
        lambda m, *_: m.loss(),
        steps=steps,
        sample_batch=lambda i, g: (),
        lr=lr,
        weight_decay=0.0,
        optimizer=tracker.make_optimizer,
        grad_clip=None,
        callback=tracker,
        progress=False,
    )
    return tracker.rec


def test_precond_eigenvalue_matches_numpy_eigvals_on_a_quadratic():
    """η·λ_max(Ĥ) from warm-started power iteration with HVPs = η·max eig(diag(1/(√v̂+ε))·A) from numpy."""
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    a_mat = q @ np.diag([5.0, 2.0, 1.0, 0.5, 0.2, 0.05]) @ q.T
    theta0, lr, b1, b2, eps = rng.normal(size=6), 0.01, 0.9, 0.999, 1e-8
    rec = _track_quadratic(a_mat, theta0, lr, b1, b2, eps, steps=60, power_iters=60)
    ref = _adam_reference(a_mat, theta0, lr, b1, b2, eps, 60)
    for t in (0, 10, 30, 59):
        _, g, vhat, u = ref[t]
        d = 1.0 / (np.sqrt(vhat) + eps)
        closed = lr * np.max(np.linalg.eigvals(np.diag(d) @ a_mat).real)
        assert rec["eta_lambda_max_precond"][t] == pytest.approx(closed, rel=1e-6)
        assert rec["eta_lambda_max_raw"][t] == pytest.approx(lr * 5.0, rel=1e-6)
        lam_grad = lr * (u @ a_mat @ u) / (g @ u) if g @ u > 0 else math.inf
        assert rec["eta_lambda_grad"][t] == pytest.approx(lam_grad, rel=1e-6)
        assert rec["decoupling_ratio"][t] == pytest.approx((g @ g) / vhat.sum(), rel=1e-9)


def test_lambda_grad_gives_the_exact_sign_of_each_step_on_a_quadratic():
    """On a quadratic ΔL = −η gᵀu + ½η² uᵀAu exactly, so 'η·λ_grad > 2' is the sign of ΔL at every step."""
    rng = np.random.default_rng(5)
    a_mat = np.diag([50.0, 1.0, 0.1])
    rec = _track_quadratic(a_mat, rng.normal(size=3), 0.05, 0.0, 0.99, 0.0, steps=400, power_iters=3)
    loss = rec["log10_loss"]
    rise = loss[1:] > loss[:-1]
    pred = rec["eta_lambda_grad"][:-1] > 2
    assert rise.any() and (~rise).any()  # the run has both kinds of steps
    assert np.array_equal(rise, pred)


def test_log_domain_quadratic_matches_float64_and_torch_adam():
    """The log-space scalar recursion equals a plain float64 recursion and torch's Adam while float64 lasts."""
    import torch

    from pipelines.adamspike.model import quad_run
    from pipelines.core.training import fit

    for b1 in (0.0, 0.9):
        tr = quad_run(1.0, 1.0, 0.1, 150, "adam", b1, 0.99, 1e-8)
        ref = _adam_reference(np.array([[1.0]]), np.array([1.0]), 0.1, b1, 0.99, 1e-8, 150)
        ref_loss = np.array([0.5 * r[0][0] ** 2 for r in ref])
        np.testing.assert_allclose(tr.log10_loss[:150], np.log10(ref_loss), rtol=1e-9, atol=1e-9)
        model = _QuadModule.make(np.array([[1.0]]), np.array([1.0]))
        losses = []
        fit(
            model,
            None,
            lambda m, *_: m.loss(),
            steps=150,
            sample_batch=lambda i, g: (),
            lr=0.1,
            weight_decay=0.0,
            optimizer=lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(b1, 0.99), eps=1e-8),
            grad_clip=None,
            callback=lambda info: losses.append(info.loss),
            progress=False,
        )
        np.testing.assert_allclose(tr.log10_loss[:150], np.log10(losses), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("beta2", [0.99, 0.999])
def test_quadratic_spikes_exactly_when_threshold_is_crossed(beta2):
    """½aθ², β₁ = 0: the loss rises on exactly the steps where η·a/√v̂ > 2, the first rise is the first
    crossing, and GD at the same η (η·a = 0.1) never rises."""
    from pipelines.adamspike.model import quad_run

    tr = quad_run(1.0, 1.0, 0.1, 3000, "adam", 0.0, beta2, 0.0)
    rise = np.diff(tr.log10_loss) > 0
    above = tr.eta_lambda_precond > 2.0
    clear = np.abs(tr.eta_lambda_precond - 2.0) > 1e-9
    assert np.array_equal(rise[clear], above[clear])
    assert np.flatnonzero(rise)[0] == np.flatnonzero(above)[0]
    assert tr.log10_loss.min() < -280  # far below float64's range for β₂ = 0.999
    assert tr.log10_loss[np.argmin(tr.log10_loss) :].max() - tr.log10_loss.min() > 200
    gd = quad_run(1.0, 1.0, 0.1, 3000, "gd")
    assert np.all(np.diff(gd.log10_loss) < 0)


def test_mlp_hvp_and_gradient_match_torch_double_backward():
    import torch

    from pipelines.adamspike.data import fn64
    from pipelines.adamspike.model import MlpCurvature, autograd_hvp, flat_params, make_mlp

    d = fn64(32)
    model = make_mlp(16, 1)
    x = torch.tensor(d["x"].to_numpy())[:, None]
    y = torch.tensor(d["y"].to_numpy())
    c = MlpCurvature(d["x"].to_numpy(), d["y"].to_numpy(), 16).at(flat_params(model))
    loss = ((model(x).squeeze(-1) - y) ** 2).mean()
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, list(model.parameters()))]).numpy()
    assert c.loss() == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(c.grad(), g, rtol=1e-10, atol=1e-13)
    vs = np.random.default_rng(0).normal(size=(g.size, 3))
    ref = autograd_hvp(model, x, y, vs)
    np.testing.assert_allclose(c.hvp(vs), ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(c.hvp(vs[:, 0]), ref[:, 0], rtol=1e-9, atol=1e-12)


def test_spike_detection_alarms_and_scoring_by_brute_force():
    from pipelines.adamspike.anatomy import alarms, detect_spikes, score_alarms

    ll = np.linspace(0, -5, 1000)
    ll[300:310] = np.linspace(0.0, 1.0, 10)  # a spike detected at 300 (> 1 decade over the previous min)
    ll[350:355] = -0.5  # within 200 steps of the first: merged
    ll[800:820] = -1.0  # a second event
    ev = detect_spikes(ll, 10.0, 100, 200)
    brute = [t for t in range(1, 1000) if ll[t] > ll[max(0, t - 100) : t].min() + 1]
    assert [e.detect for e in ev] == [300, 800] and brute[0] == 300 and 800 in brute
    assert ev[0].peak == 309 and ev[0].onset == 299
    cond = np.zeros(1000, bool)
    cond[280:295] = True  # run of 15 → one alarm at 289 (k = 10), 11 steps before the spike
    cond[500:520] = True  # alarm at 509, no spike follows: false positive
    cond[760:765] = True  # run of 5 → no alarm
    al = alarms(cond, 10)
    assert al.tolist() == [289, 509]
    sc = score_alarms(al, [e.detect for e in ev], 50)
    assert sc["precision"] == 0.5 and sc["recall"] == 0.5 and sc["median_lead"] == 11.0


def test_stages_on_the_quadratic_follow_the_anatomy():
    """S2 (decoupled) before the spike, S4 from the loss minimum to the peak, S5 after it."""
    from pipelines.adamspike.evaluate import analyse
    from pipelines.adamspike.train import run_quad

    p = Params.model_validate({**RAW, "quad": {"steps": 1200}})
    a = analyse(run_quad(p, p.configs["quad_adam"], 0), p.configs["quad_adam"], p)
    e = a["events"][0]
    lab = a["stages"]
    assert e.onset == int(np.argmin(a["run"]["log10_loss"]))
    assert set(lab[e.onset : e.peak + 1]) == {4} and lab[e.peak + 1] == 5
    assert np.mean(lab[50 : e.onset] == 2) > 0.9


def test_results_table_and_artifacts_round_trip_the_per_step_analysis():
    """train_variant's long table holds the analysis of each seed's run (what the old report computed from
    the per-step table), and the tensors artifact gives the same per-step table back (plots, pooled study)."""
    from pipelines.adamspike.evaluate import analyse, results_table, runs_from_artifacts, steps_artifact
    from pipelines.adamspike.train import COLUMNS, run_quad
    from pipelines.core.spec import SeedValues

    p = Params.model_validate({**RAW, "seeds": [0, 1], "quad": {"steps": 600}, "history_points": 50})
    cfg = p.configs["quad_adam"]
    run = pd.concat([run_quad(p, cfg, s) for s in p.seeds], ignore_index=True)[COLUMNS]
    values = SeedValues({"quad_adam": results_table(p, "quad_adam", run)})
    ref = analyse(run[run["seed"] == 0], cfg, p)["row"]
    got = values.metrics("quad_adam")
    assert got["n_spikes"] == {0: ref["n_spikes"], 1: ref["n_spikes"]}
    assert got["max_eta_lambda_precond"][0] == ref["max_eta_lambda_precond"]
    hist = values.histories()["quad_adam"]
    assert {"log10_loss", "stage", "eta_lambda_grad", "log10_loss_seed1"} <= set(hist)
    assert len(hist["log10_loss"]["step"]) <= 50
    back = runs_from_artifacts({"quad_adam": steps_artifact(run)})["quad_adam"]
    pd.testing.assert_frame_equal(back, run)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (
            {**RAW, "configs": {**CONFIGS, "mlp_adam": {"model": "mlp", "beta2": 1.0}}},
            r"adamspike\.configs\.mlp_adam\.beta2",
        ),
        ({**RAW, "predictor": {"k": 0}}, r"adamspike\.predictor\.k"),
        ({**RAW, "variants": ["quad_adam", "nope"]}, r"'nope'.*not defined under configs"),
        ({**RAW, "quad": {"theta0": 0.0}}, r"adamspike\.quad\.theta0"),
        ({**RAW, "tracking": {"hvp": "finite_diff"}}, r"adamspike\.tracking\.hvp"),
    ],
)
def test_bad_parameter_names_the_key(raw, match):
    with pytest.raises(ParameterError, match=match):
        validate(Params, raw, "adamspike")


def test_bad_user_table_names_dataset_and_column(tmp_path):
    from pipelines.adamspike.data import load_user_table
    from pipelines.core.schemas import InputDataError

    f = tmp_path / "curve.csv"
    pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "target": [1.0, 2.0, 3.0, 4.0]}).to_csv(f, index=False)
    with pytest.raises(InputDataError, match=r"adamspike\.user_data.*column 'y' is missing"):
        load_user_table(str(f))
    pd.DataFrame({"x": ["a", "b", "c", "d"], "y": [1.0, 2.0, 3.0, 4.0]}).to_csv(f, index=False)
    with pytest.raises(InputDataError, match=r"column 'x' should be number"):
        load_user_table(str(f))
    pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "y": [1.0, 2.0, 3.0, 4.0]}).to_csv(f, index=False)
    assert len(load_user_table(str(f))) == 4
