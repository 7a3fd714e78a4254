"""The training loop: learns a least-squares problem to the closed form, restores the best epoch, and
stops on a NaN loss with the node's name."""

import pytest
import torch

from pipelines.core.runctx import current_node
from pipelines.core.training import NonFiniteLossError, fit


def test_fit_reaches_least_squares_solution():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.01 * torch.randn(256, 1, generator=g)
    model = torch.nn.Linear(3, 1, bias=False)
    fit(
        model,
        [x, y],
        lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
        epochs=200,
        lr=0.05,
        weight_decay=0.0,
        batch_size=64,
        progress=False,
    )
    w_ls = torch.linalg.lstsq(x, y).solution
    assert torch.allclose(model.weight.data.T, w_ls, atol=1e-2)


def test_early_stopping_restores_best_weights():
    model = torch.nn.Linear(1, 1)
    scores = iter([3.0, 1.0, 2.0, 5.0, 6.0, 7.0])
    seen = {}

    def val(m):
        s = next(scores)
        seen[s] = m.weight.detach().clone()
        return s

    x = torch.randn(32, 1)
    res = fit(
        model,
        [x, 2 * x],
        lambda m, a, b: ((m(a) - b) ** 2).mean(),
        val_score=val,
        epochs=6,
        patience=2,
        lr=0.1,
        progress=False,
    )
    assert res.best_epoch == 1 and res.epochs_run == 4
    assert torch.equal(model.weight.detach(), seen[1.0])


def test_nan_loss_names_the_node():
    token = current_node.set("m.train.model")
    try:
        with pytest.raises(NonFiniteLossError, match=r"node 'm\.train\.model': probe loss is nan at epoch 0"):
            fit(
                torch.nn.Linear(1, 1),
                [torch.ones(4, 1)],
                lambda m, a: m(a).sum() * float("nan"),
                epochs=1,
                desc="probe",
                progress=False,
            )
    finally:
        current_node.reset(token)


def _ls_problem(n=128):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]])


def test_steps_mode_with_sampled_batches_callback_and_schedule():
    x, y = _ls_problem()
    model = torch.nn.Linear(3, 1, bias=False)
    seen = []

    def sample(step, gen):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        return x[idx], y[idx]

    res = fit(
        model,
        None,
        lambda m, a, b: (torch.nn.functional.mse_loss(m(a), b), {"half": 0.5}),
        sample_batch=sample,
        steps=300,
        lr=0.05,
        weight_decay=0.0,
        scheduler="onecycle",
        callback=lambda info: seen.append((info.step, info.loss, info.extras["half"])),
        progress=False,
    )
    assert res.steps_run == 300 and [s for s, _, _ in seen] == list(range(300)) and seen[-1][2] == 0.5
    assert len(res.step_seconds) == 300 and seen[-1][1] < seen[0][1] / 100
    assert torch.allclose(model.weight.data.T, torch.linalg.lstsq(x, y).solution, atol=1e-2)


def test_full_batch_lbfgs_reaches_the_closed_form():
    x, y = _ls_problem()
    torch.manual_seed(0)  # the start must not depend on which tests ran before
    model = torch.nn.Linear(3, 1, bias=False)
    fit(
        model,
        [x, y],
        lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
        epochs=5,
        batch_size=None,
        optimizer="lbfgs",
        lr=1.0,
        grad_clip=None,
        progress=False,
    )
    # float32 L-BFGS stops at ~1e-5 from the optimum (its gradient tolerance), whatever the start
    assert torch.allclose(model.weight.data.T, torch.linalg.lstsq(x, y).solution, atol=1e-4)


def test_steps_cap_epochs_and_validation_every_k_steps():
    x, y = _ls_problem(64)
    model = torch.nn.Linear(3, 1, bias=False)
    res = fit(
        model,
        [x, y],
        lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
        epochs=100,
        steps=10,
        batch_size=16,
        val_score=lambda m: 1.0,
        val_every=5,
        progress=False,
    )
    assert res.steps_run == 10 and [r["step"] for r in res.history] == [5, 10] and res.best_epoch == 5


def test_same_seed_same_weights():
    x, y = _ls_problem()
    ws = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        fit(
            model,
            [x, y],
            lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
            epochs=3,
            batch_size=16,
            seed=7,
            progress=False,
        )
        ws.append(model.weight.detach().clone())
    assert torch.equal(ws[0], ws[1])


def test_callback_sees_the_optimizer_state_and_clipping_is_optional():
    x, y = _ls_problem()
    moments = []

    def grab(info):
        state = info.optimizer.state[info.model.weight]
        moments.append(state["exp_avg_sq"].clone())

    for clip in (None, 1e-3):
        model = torch.nn.Linear(3, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        fit(
            model,
            (x, y),
            lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
            epochs=1,
            batch_size=None,
            optimizer="adam",
            lr=0.1,
            weight_decay=0.0,
            grad_clip=clip,
            callback=grab,
            progress=False,
        )
    g = 2 * ((x @ torch.zeros(3, 1) - y) * x).mean(0)  # the first full-batch gradient at w = 0
    assert torch.allclose(moments[0][0], (1 - 0.999) * g**2, rtol=1e-4)  # v_1 = (1 - β₂) g²
    assert moments[1].norm() < moments[0].norm() * 1e-4  # clipped gradient, smaller moment


def test_no_gradient_clipping_unless_asked():
    x, y = _ls_problem()
    norms = {}
    for clip in (None, 0.5):
        seen = []
        model = torch.nn.Linear(3, 1, bias=False)
        kw = {} if clip is None else {"grad_clip": clip}
        fit(
            model,
            (x, y),
            lambda m, a, b: torch.nn.functional.mse_loss(m(a), b),
            epochs=2,
            batch_size=None,
            callback=lambda s: seen.append(s.grad_norm),
            progress=False,
            **kw,
        )
        norms[clip] = seen
    assert norms[None] == [None, None]  # the default measures and clips nothing
    assert all(n is not None and n > 0 for n in norms[0.5])
