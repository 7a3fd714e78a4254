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
    fit(model, [x, y], lambda m, a, b: torch.nn.functional.mse_loss(m(a), b), epochs=200, lr=0.05,
        weight_decay=0.0, batch_size=64, progress=False)
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
    res = fit(model, [x, 2 * x], lambda m, a, b: ((m(a) - b) ** 2).mean(), val_score=val, epochs=6,
              patience=2, lr=0.1, progress=False)
    assert res.best_epoch == 1 and res.epochs_run == 4
    assert torch.equal(model.weight.detach(), seen[1.0])


def test_nan_loss_names_the_node():
    token = current_node.set("m.train.model")
    try:
        with pytest.raises(NonFiniteLossError, match=r"node 'm\.train\.model': probe loss is nan at epoch 0"):
            fit(torch.nn.Linear(1, 1), [torch.ones(4, 1)], lambda m, a: m(a).sum() * float("nan"),
                epochs=1, desc="probe", progress=False)
    finally:
        current_node.reset(token)
