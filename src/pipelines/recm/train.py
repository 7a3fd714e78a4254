"""Training of every variant through ``core.training.fit`` (node ``train.<variant>``: every ε × seed of
one variant), the RECM update (our reconstruction), run in fit's per-step callback,
and the baselines' relaxation schedules (strict θ ≡ 0, fixed θ, RPP θ ≡ 1 with weight decay, CR θ 1 → 0
with an equivariance penalty and the branch dropped at the end)."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import StepInfo, fit, node_setup
from pipelines.recm.data import arrays, eps_tag
from pipelines.recm.model import RelaxedNet, diag_sums, equivariance_error, perp_inner, reynolds, shift
from pipelines.recm.params import Params, Recm, Variant


def build_model(p: Params, spec: Variant) -> RelaxedNet:
    theta0 = {
        "strict": 0.0,
        "unconstrained": 1.0,
        "fixed": spec.theta or 0.0,
        "rpp": 1.0,
        "cr": 1.0,
        "recm": p.recm.theta0,
    }[spec.kind]
    m = p.model
    return RelaxedNet(
        c_in=2,
        channels=m.channels,
        hidden=m.hidden,
        L=p.data.L,
        kernel=m.kernel,
        use_eq=spec.kind != "unconstrained",
        theta0=theta0,
        u_init=m.u_init,
    )


def trainable(model: RelaxedNet, spec: Variant) -> list[torch.nn.Parameter]:
    """The parameters a variant actually uses (strict never touches U)."""
    out = []
    for layer in model.layers:
        out += [q for q in (layer.E, layer.bias) if q is not None]
        if spec.kind != "strict":
            out.append(layer.U)
    return out


def n_params(
    model: RelaxedNet, spec: Variant, thetas: list[float] | None = None, projected: list[bool] | None = None
) -> int:
    """Parameters of the deployed net: U counts only in layers whose branch is kept, and a branch
    projected onto the equivariant maps counts as a full-width kernel (c_out · c_in · L)."""
    thetas = thetas if thetas is not None else model.thetas()
    projected = projected or [False] * len(thetas)
    n = 0
    for layer, th, pr in zip(model.layers, thetas, projected):
        n += layer.bias.numel() + (layer.E.numel() if layer.E is not None else 0)
        if th != 0.0:
            n += layer.c_out * layer.c_in * layer.L if pr else layer.U.numel()
    return n


def make_optimizer(model: RelaxedNet, spec: Variant, p: Params):
    """The shared optimizer (``train.optimizer``, lr); RPP alone adds its prior: separate weight decay on
    the unconstrained (wd_u) and equivariant (wd_e) weights."""
    t = p.train
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[t.optimizer]
    extra = {"momentum": 0.9} if t.optimizer == "sgd" else {}
    if spec.kind == "rpp":
        u = [layer.U for layer in model.layers]
        e = [layer.E for layer in model.layers]
        b = [layer.bias for layer in model.layers]
        groups = [
            {"params": u, "weight_decay": spec.wd_u},
            {"params": e, "weight_decay": spec.wd_e},
            {"params": b, "weight_decay": 0.0},
        ]
        return lambda _params: cls(groups, lr=t.lr, **extra)
    return lambda params: cls(params, lr=t.lr, weight_decay=t.weight_decay, **extra)


# --------------------------------------------------------------------------- the RECM rule
class RecmRule:
    """Per layer ℓ and step t (our reconstruction):
      G_t = Σ_b δ_b h_bᵀ, the dense-map gradient (∂L/∂W_eff), from the pre-activation hook;
      two EMAs of G fed by alternating minibatches (A on even steps, B on odd), n_t = EMA ‖G_t‖_F,
      all Adam-style bias-corrected; s_t = √max(0, ⟨P⊥M^A, P⊥M^B⟩) / n_t (noise cancels in expectation);
      θ ← clip((1−α)θ + α s_t, 0, 1).
    Rules: ``two_ema`` (the above), ``single_ema`` (s = ‖P⊥M‖/n, which has a noise floor),
    ``grad_at_eq`` (G from a second pass with θ = 0), ``branch_violation``
    (s = ‖U g·h − g·U h‖ / ‖U h‖ for a random shift g on the batch)."""

    def __init__(self, model: RelaxedNet, r: Recm, rule: str, loss_of_batch=None, seed: int = 0):
        self.model, self.r, self.rule, self.loss_of_batch = model, r, rule, loss_of_batch
        n = len(model.layers)
        self.ma: list[list[torch.Tensor] | None] = [None] * n  # [EMA of G, EMA of D(G)]
        self.mb: list[list[torch.Tensor] | None] = [None] * n
        self.ka = self.kb = self.k = 0
        self.norm = [0.0] * n
        self.s = [math.nan] * n
        self.gen = torch.Generator().manual_seed(seed)
        model.set_track(rule in ("two_ema", "single_ema", "branch_violation"))

    def _dense_grads(self, batch) -> list[torch.Tensor]:
        if self.rule != "grad_at_eq":
            return [layer.dense_grad() for layer in self.model.layers]
        saved = self.model.thetas()
        self.model.set_theta(0.0)
        self.model.set_track(True)
        loss = self.loss_of_batch(self.model, *batch)
        loss.backward()
        grads = [layer.dense_grad() for layer in self.model.layers]
        self.model.zero_grad(set_to_none=True)
        self.model.set_track(False)
        self.model.set_theta(saved)
        return grads

    @torch.no_grad()
    def _violation(self, layer) -> float:
        h = layer.h
        B = h.shape[0]
        k = int(torch.randint(1, layer.L, (1,), generator=self.gen))
        Uh = (h.reshape(B, -1) @ layer.U.T).view(B, layer.c_out, layer.L)
        Ugh = (shift(h, k).reshape(B, -1) @ layer.U.T).view(B, layer.c_out, layer.L)
        return float((Ugh - shift(Uh, k)).norm() / Uh.norm().clamp_min(1e-12))

    @torch.no_grad()
    def update(self, step: int, batch=None) -> list[float]:
        r, layers = self.r, self.model.layers
        if self.rule == "branch_violation":
            self.s = [self._violation(layer) for layer in layers]
        else:
            with torch.enable_grad():
                grads = self._dense_grads(batch)
            self.k += 1
            to_a = step % 2 == 0 or self.rule == "single_ema"
            if to_a:
                self.ka += 1
            else:
                self.kb += 1
            for i, (layer, G) in enumerate(zip(layers, grads)):
                L = layer.L
                D = diag_sums(G, layer.c_out, layer.c_in, L)
                self.norm[i] = r.beta * self.norm[i] + (1 - r.beta) * float(G.norm())
                # EMAs of G and of its circulant-diagonal sums D(G) (linear, so D of the EMA is the EMA of
                # D): ⟨P⊥A, P⊥B⟩ = ⟨A, B⟩ − ⟨D(A), D(B)⟩ / L without projecting anything
                ema = self.ma if to_a else self.mb
                if ema[i] is None:
                    ema[i] = [G * (1 - r.beta), D * (1 - r.beta)]
                else:
                    ema[i][0].mul_(r.beta).add_(G, alpha=1 - r.beta)
                    ema[i][1].mul_(r.beta).add_(D, alpha=1 - r.beta)
                n_hat = self.norm[i] / (1 - r.beta**self.k)
                if self.rule == "single_ema":
                    (M, DM), c = self.ma[i], 1 - r.beta**self.ka
                    sq = max(0.0, float((M * M).sum() - (DM * DM).sum() / L))
                    s = math.sqrt(sq) / c / (n_hat + 1e-12)
                elif self.mb[i] is None:
                    s = math.nan  # the B average has not seen a batch yet: θ is left as it is
                else:
                    (A, DA), (B, DB) = self.ma[i], self.mb[i]
                    ca, cb = 1 - r.beta**self.ka, 1 - r.beta**self.kb
                    inner = float((A * B).sum() - (DA * DB).sum() / L) / (ca * cb)
                    s = math.sqrt(max(0.0, inner)) / (n_hat + 1e-12)
                self.s[i] = s
        for layer, s in zip(layers, self.s):
            if not math.isnan(s):
                layer.theta.fill_(min(1.0, max(0.0, (1 - r.alpha) * float(layer.theta) + r.alpha * s)))
        return self.s


# --------------------------------------------------------------------------- one run
def mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def test_mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(((model(x) - y) ** 2).mean())


def train_one(
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    p: Params,
    spec: Variant,
    seed: int,
    device: torch.device,
    desc: str = "model",
) -> tuple[dict, dict, dict]:
    """One variant on one ε and seed: its metrics row, its histories ``{name: {"step", "value"}}`` and
    its state dict. Inputs and targets are scaled by one scalar (the train targets' std), which keeps the
    symmetry; ``test_mse`` is on that scale (a relative MSE)."""
    t, L = p.train, p.data.L
    scale = float(y_tr.std()) or 1.0
    if spec.shuffle_targets:  # the control: no input–target relation left, symmetric or not
        y_tr = y_tr[np.random.default_rng(seed).permutation(len(y_tr))]

    def tensor(a):
        return torch.as_tensor(a / scale, dtype=torch.float32, device=device)

    xtr, ytr, xte, yte = tensor(x_tr), tensor(y_tr), tensor(x_te), tensor(y_te)
    torch.manual_seed(seed)
    model = build_model(p, spec).to(device)
    n_layers = len(model.layers)
    hist: dict[str, list[tuple[int, float]]] = {"train_mse": []}
    for i in range(n_layers):
        hist[f"theta_l{i}"] = []
        if spec.kind == "recm":
            hist[f"s_l{i}"] = []
    last_batch: dict = {}

    def loss_fn(m: RelaxedNet, x: torch.Tensor, y: torch.Tensor):
        last_batch["b"] = (x, y)
        loss = mse(m, x, y)
        extras = {"mse": loss.detach()}
        if spec.kind == "cr" and spec.penalty > 0:
            pen = sum(perp_inner(layer.U, layer.U, layer.c_out, layer.c_in, L) for layer in m.layers)
            loss = loss + spec.penalty * pen
            extras["penalty"] = pen.detach()
        return loss, extras

    rule = RecmRule(model, p.recm, spec.rule, loss_of_batch=mse, seed=seed) if spec.kind == "recm" else None

    def on_step(info: StepInfo) -> None:
        if rule is not None:
            s = rule.update(info.step, last_batch.get("b"))
        elif spec.kind == "cr":
            model.set_theta(max(0.0, 1.0 - (info.step + 1) / t.steps))
        if info.step % t.log_every == 0 or info.step == t.steps - 1:
            hist["train_mse"].append((info.step, info.extras.get("mse", info.loss)))
            for i, th in enumerate(model.thetas()):
                hist[f"theta_l{i}"].append((info.step, th))
                if rule is not None and not math.isnan(s[i]):
                    hist[f"s_l{i}"].append((info.step, s[i]))

    t0, c0 = time.perf_counter(), time.process_time()
    res = fit(
        model,
        (xtr, ytr),
        loss_fn,
        epochs=None,
        steps=t.steps,
        batch_size=t.batch_size,
        lr=t.lr,
        optimizer=make_optimizer(model, spec, p),
        params=trainable(model, spec),
        grad_clip=t.grad_clip,
        seed=seed,
        desc=desc,
        callback=on_step,
    )
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    model.set_track(False)

    final = model.thetas()
    row: dict[str, float] = {f"final_theta_l{i}": th for i, th in enumerate(final)}
    row["max_final_theta"] = max(final)
    projected = [False] * n_layers
    if spec.kind == "recm":
        # Layers under τ lose the symmetry-breaking part of their branch: U ← P_eq(U). The layer is then
        # exactly equivariant and keeps what its branch learnt that respects the symmetry (a full-width
        # circular convolution); the planned hard drop (U ← 0) is measured too, as test_mse_drop_u.
        row["test_mse_before_snap"] = test_mse(model, xte, yte)
        snap = [th < p.recm.tau for th in final]
        saved = [layer.theta.clone() for layer in model.layers]
        model.set_theta([0.0 if sn else th for sn, th in zip(snap, final)])
        row["test_mse_drop_u"] = test_mse(model, xte, yte)
        for layer, th in zip(model.layers, saved):
            layer.theta.copy_(th)
        with torch.no_grad():
            for layer, sn in zip(model.layers, snap):
                if sn:
                    layer.U.copy_(reynolds(layer.U, layer.c_out, layer.c_in, layer.L))
        projected = snap
        row["n_layers_snapped"] = float(sum(snap))
    elif spec.kind == "cr":
        model.set_theta(0.0)  # CR ends strictly equivariant
    final = model.thetas()
    n_eq = min(t.equiv_test_inputs, len(xte))
    row.update(
        {
            "test_mse": test_mse(model, xte, yte),
            "train_mse": test_mse(model, xtr, ytr),
            "equiv_error": equivariance_error(model, xte[:n_eq]),
            "n_params": float(n_params(model, spec, final, projected)),
            "train_time_s": train_s,
            "train_cpu_s": train_cpu_s,
            "steps": float(res.steps_run),
            "step_ms": 1e3 * float(np.median(res.step_seconds)) if res.step_seconds else math.nan,
        }
    )
    series = {k: {"step": [s for s, _ in v], "value": [float(x) for _, x in v]} for k, v in hist.items() if v}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return row, series, state


CONSTANT_THETA = ("strict", "unconstrained", "fixed", "rpp")  # θ never moves: no θ history


def train_variant(dataset: pd.DataFrame, gaps: pd.DataFrame, p: Params, variant: str):
    """The node ``train.<variant>``: every ε × seed of one variant. Returns its long table (per seed the
    metrics ``<metric>.<eps tag>``, the data-level ``symmetry_gap_linear.<eps tag>``, for the strict CNN
    each layer's measured gap ``layer_gap_l<ℓ>.<eps tag>``; the histories ``<name>.<eps tag>``) and its
    state dicts ``{eps_tag: {"seed<s>": state}}``."""
    from pipelines.core.api import Results
    from pipelines.recm.evaluate import layer_gap

    spec = p.variants[variant]
    gap = {eps_tag(r.eps): float(r.symmetry_gap_linear) for r in gaps.itertuples()}
    res, states = Results(variant), {}
    for eps in p.data.eps:
        x_tr, y_tr = arrays(dataset, eps, "train")
        x_te, y_te = arrays(dataset, eps, "test")
        tag = eps_tag(eps)
        for seed in p.seeds:
            device = node_setup(p, seed)
            row, series, state = train_one(
                x_tr, y_tr, x_te, y_te, p, spec, seed, device, desc=f"{variant} {tag} seed {seed}"
            )
            res.add(seed, **{f"{k}.{tag}": v for k, v in row.items()})
            res.add(seed, **{f"symmetry_gap_linear.{tag}": gap.get(tag, math.nan)})
            if spec.kind == "strict":
                # the layers' measured symmetry gap at the trained strict net (CPU, from its saved state)
                model = build_model(p, Variant(kind="strict"))
                model.load_state_dict(state)
                res.add(
                    seed,
                    **{
                        f"layer_gap_l{i}.{tag}": g
                        for i, g in enumerate(layer_gap(model, x_tr, y_tr, p.train.batch_size))
                    },
                )
            for name, s in series.items():
                if name.startswith("theta_l") and spec.kind in CONSTANT_THETA:
                    continue
                res.history(seed, f"{name}.{tag}", s["value"], s["step"])
            states.setdefault(tag, {})[f"seed{seed}"] = state
    return res.table(), states
