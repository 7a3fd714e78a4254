"""Tests of `ghost`: balanced-truncation scores against the Hankel singular values from scipy's Lyapunov
solvers on an LTI system, the GHOST score against the brute-force output error of removing a channel,
Taylor / Fisher against finite differences, 0% pruning, masking vs hard truncation, the selection rules,
the corpus generator, the derived metrics declared on the results tables, bad parameters and bad user
files. The end-to-end
--env=test run is covered by tests/methods/test_all_pipelines.py (its report is checked here through the
shared ``test_env_run`` fixture)."""

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.core.schemas import InputDataError
from pipelines.core.seqmodels import SelectiveSSM, SelectiveSSMLM, SSMConfig
from pipelines.ghost import model as M
from pipelines.ghost.params import Params

ROOT = Path(__file__).resolve().parents[2]


def env_raw(env: str = "base") -> dict:
    def merge(a, b):
        return {
            k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            for k, v in {**a, **b}.items()
        }

    raw = yaml.safe_load((ROOT / "conf" / "base" / "parameters_ghost.yml").read_text())["ghost"]
    if env != "base":
        raw = merge(raw, yaml.safe_load((ROOT / "conf" / env / "parameters_ghost.yml").read_text())["ghost"])
    return raw


def parse(raw: dict) -> Params:
    return validate(Params, raw, "ghost")


def tiny_lm(seed=0, n_groups=2, d_conv=3, double=True) -> SelectiveSSMLM:
    torch.manual_seed(seed)
    m = SelectiveSSMLM(
        SSMConfig(
            vocab_size=11,
            d_model=8,
            n_layers=2,
            d_state=6,
            n_heads=4,
            n_groups=n_groups,
            expand=2,
            d_conv=d_conv,
            scan="chunked",
            chunk_size=8,
        )
    )
    with torch.no_grad():  # a random but non-trivial model: larger B, C and slower decays than at init
        for layer in m.layers:
            layer.in_proj.weight.mul_(8.0)
            layer.log_neg_a.copy_(torch.log(torch.linspace(0.2, 2.0, layer.h)))
    return (m.double() if double else m).eval()


# ------------------------------------------------------------------ balanced truncation on an LTI system
def lti_layer(dt, a, b, c) -> SelectiveSSM:
    """A SelectiveSSM that is a diagonal LTI system: H heads of dimension 1, one channel per head (one group
    per head), x_t = u_t (identity in_proj), B, C, Δ constant (biases only), decay a_h = exp(−Δ_h e^{·})."""
    H = len(a)
    layer = SelectiveSSM(
        SSMConfig(vocab_size=4, d_model=H, n_layers=1, d_state=1, n_heads=H, n_groups=H, expand=1, d_conv=0)
    ).double()
    with torch.no_grad():
        layer.in_proj.weight.zero_()
        layer.in_proj.bias.zero_()
        layer.in_proj.weight[:H, :H] = torch.eye(H, dtype=torch.double)
        layer.in_proj.bias[2 * H : 3 * H] = torch.tensor(b)
        layer.in_proj.bias[3 * H : 4 * H] = torch.tensor(c)
        layer.dt_bias.copy_(torch.tensor(np.log(np.expm1(dt))))
        layer.log_neg_a.copy_(torch.tensor(np.log(-np.log(a) / dt)))
    return layer


def scipy_hsv(A, B, C, continuous=False):
    from scipy.linalg import solve_continuous_lyapunov, solve_discrete_lyapunov

    if continuous:
        Wc = solve_continuous_lyapunov(A, -B @ B.T)
        Wo = solve_continuous_lyapunov(A.T, -C.T @ C)
    else:
        Wc = solve_discrete_lyapunov(A, B @ B.T)
        Wo = solve_discrete_lyapunov(A.T, C.T @ C)
    return np.sqrt(np.abs(np.linalg.eigvals(Wc @ Wo)))


def test_balanced_truncation_scores_match_hankel_singular_values_of_an_lti_system():
    dt = np.array([0.3, 0.5, 0.2, 0.8, 0.4])
    a = np.array([0.9, 0.5, 0.95, 0.7, 0.8])
    b = np.array([1.0, -0.7, 0.4, 1.3, 0.9])
    c = np.array([0.5, 1.2, -0.8, 0.3, 1.0])
    layer = lti_layer(dt, a, b, c)
    u = torch.randn(32, 3000, 5, dtype=torch.double, generator=torch.Generator().manual_seed(0))  # white, var 1
    stats = M.forward_statistics(layer, u)
    scores = M.forward_score(stats, "balanced_truncation").flatten().numpy()
    hsv = scipy_hsv(np.diag(a), np.diag(dt * b), np.diag(c))
    np.testing.assert_allclose(np.sort(scores), np.sort(hsv), rtol=0.03)  # equal up to ordering
    assert (np.argsort(scores) == np.argsort(hsv)).all()  # and in the same order


def test_balanced_truncation_scores_approach_the_continuous_time_hankel_values_for_small_steps():
    # a = e^{λΔ}, input gain Δ·b: as Δ → 0 the discrete Hankel values tend to those of ẋ = λx + b u, y = c x
    lam = np.array([-1.0, -2.5, -4.0, -1.5])
    dt = np.full(4, 0.01)
    b = np.array([1.0, 2.0, -3.0, 0.5])
    c = np.array([0.8, -1.0, 1.5, 2.0])
    layer = lti_layer(dt, np.exp(lam * dt), b, c)
    u = torch.randn(32, 4000, 4, dtype=torch.double, generator=torch.Generator().manual_seed(7))
    scores = M.forward_score(M.forward_statistics(layer, u), "balanced_truncation").flatten().numpy()
    hsv_c = scipy_hsv(np.diag(lam), np.diag(b), np.diag(c), continuous=True)
    np.testing.assert_allclose(hsv_c, np.abs(b * c) / (2 * np.abs(lam)), rtol=1e-10)
    np.testing.assert_allclose(np.sort(scores), np.sort(hsv_c), rtol=0.08)


def test_ghost_score_ranks_lti_modes_like_hankel_values_when_decays_are_equal():
    # one scalar decay per head in Mamba2: within a head GHOST = Wc·c² = HSV²·(1 − a²), same order as HSV
    a = np.full(5, 0.8)
    dt = np.full(5, 0.4)
    b = np.array([1.0, -0.7, 0.4, 1.3, 0.9])
    c = np.array([0.5, 1.2, -0.8, 0.3, 1.0])
    layer = lti_layer(dt, a, b, c)
    u = torch.randn(32, 2000, 5, dtype=torch.double, generator=torch.Generator().manual_seed(1))
    ghost = M.forward_score(M.forward_statistics(layer, u), "ghost").flatten().numpy()
    hsv = scipy_hsv(np.diag(a), np.diag(dt * b), np.diag(c))
    assert (np.argsort(ghost) == np.argsort(hsv)).all()
    np.testing.assert_allclose(ghost / u.shape[0] / u.shape[1], hsv**2 * (1 - a**2), rtol=0.05)


# ------------------------------------------------------------------ GHOST = exact output error of removing n
def test_ghost_score_is_the_squared_output_error_of_removing_one_channel():
    m = tiny_lm()
    layer = m.layers[0]
    u = torch.randn(3, 13, 8, dtype=torch.double, generator=torch.Generator().manual_seed(2))
    stats = M.forward_statistics(layer, u)
    with torch.no_grad():
        x, _, b, cc, dt, decay = layer._split(u)

        def ssm_out(bb, ccc):  # brute-force recurrence, y_t = S_t C_t (before skip / gate)
            h = torch.zeros(3, layer.h, layer.dh, layer.n, dtype=torch.double)
            ys = []
            for t in range(13):
                h = decay[:, t, :, None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * bb[:, t, :, None, :]
                ys.append(torch.einsum("bhdn,bhn->bhd", h, ccc[:, t]))
            return torch.stack(ys, 1)

        full = ssm_out(b, cc)
        rep = layer.h // layer.g
        for g in range(layer.g):
            for n in (0, 3, 5):
                mask = torch.ones_like(b)
                mask[:, :, g * rep : (g + 1) * rep, n] = 0
                err = (full - ssm_out(b * mask, cc * mask)).square().sum()
                assert float(err) == pytest.approx(float(stats["joint"][g, n]), rel=1e-8)
    # the other statistics by their definitions
    assert torch.allclose(stats["obs"], cc.square().sum((0, 1)).view(layer.g, rep, -1).sum(1))


# ------------------------------------------------------------------ pruning 0 % / masking = truncation
def test_pruning_zero_percent_leaves_the_model_unchanged():
    p = parse(env_raw("test"))
    m = tiny_lm()
    ids = torch.randint(0, 11, (4, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = m(ids)
    for scorer in ("ghost", "taylor", "random", "weight_magnitude"):
        keeps, _, secs = M.prune(m, scorer, 0.0, ids, p, np.random.default_rng(0))
        assert all(bool(k.all()) for k in keeps) and secs == 0.0
    keep_all = M.keep_top(torch.rand(2, 6), 0.0)
    M.set_masks(m, [keep_all, keep_all])
    with torch.no_grad():
        assert torch.equal(m(ids), before)
        assert torch.equal(M.truncate(m, [keep_all, keep_all])(ids), before)


@pytest.mark.parametrize("rho", [0.5, 0.75])
def test_hard_truncation_equals_the_masked_model(rho):
    m = tiny_lm(double=False)
    gen = torch.Generator().manual_seed(4)
    keeps = [M.keep_top(torch.rand(2, 6, generator=gen), rho) for _ in m.layers]
    masked = copy.deepcopy(m)
    M.set_masks(masked, keeps)
    small = M.truncate(m, keeps)
    ids = torch.randint(0, 11, (3, 21), generator=gen)
    with torch.no_grad():
        assert torch.allclose(small(ids), masked(ids), atol=1e-5)
        assert not torch.allclose(small(ids), m(ids), atol=1e-3)
    k = int(round((1 - rho) * 6))
    assert all(layer.n == k and layer.in_proj.out_features == 2 * 16 + 2 * 2 * k + 4 for layer in small.layers)
    assert M.state_bytes_per_seq(keeps, m) == 2 * 4 * 4 * k * 4
    # the recurrent decode of the truncated model equals its forward (state [B, H, P, k] + conv window)
    with torch.no_grad():
        states, steps = None, []
        for t in range(ids.shape[1]):
            lg, states = small.step(ids[:, t], states)
            steps.append(lg)
    assert torch.allclose(torch.stack(steps, 1), small(ids), atol=1e-5) and states[0][0].shape[-1] == k


def test_truncation_with_unequal_groups_pads_with_switched_off_channels():
    m = tiny_lm(double=False)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, :3] = False  # global mode: group 0 keeps 3, group 1 keeps 6
    keeps = [keep, M.keep_top(torch.rand(2, 6, generator=torch.Generator().manual_seed(0)), 0.5)]
    masked = copy.deepcopy(m)
    M.set_masks(masked, keeps)
    small = M.truncate(m, keeps)
    ids = torch.randint(0, 11, (2, 15), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(small(ids), masked(ids), atol=1e-5)
    assert [layer.n for layer in small.layers] == [6, 3]


# ------------------------------------------------------------------ gradient baselines and selection
def test_taylor_and_fisher_match_finite_differences_of_the_mask():
    m = tiny_lm()
    ids = torch.randint(0, 11, (3, 17), generator=torch.Generator().manual_seed(5))
    got = M.gradient_scores(m, ids, [0, 1])
    eps = 1e-6
    layer = m.layers[1]
    rep = layer.h // layer.g
    for g, n in ((0, 1), (1, 4)):
        per_seq = []
        for s in range(3):

            def loss_at(v):
                layer.state_mask[g * rep : (g + 1) * rep, n] = v
                with torch.no_grad():
                    out = float(M.lm_loss(m, ids[s : s + 1]))
                layer.state_mask[g * rep : (g + 1) * rep, n] = 1.0
                return out

            per_seq.append((loss_at(1 + eps) - loss_at(1 - eps)) / (2 * eps))
        per_seq = np.array(per_seq)
        assert float(got[1]["taylor"][g, n]) == pytest.approx(abs(per_seq.sum()), rel=1e-4, abs=1e-9)
        assert float(got[1]["fisher"][g, n]) == pytest.approx((per_seq**2).mean(), rel=1e-4, abs=1e-12)
    assert torch.equal(layer.state_mask, torch.ones_like(layer.state_mask))  # masks restored


def test_selection_keeps_the_top_channels_of_each_group_and_recalibrates_layer_by_layer():
    s = torch.tensor([[5.0, 1.0, 3.0, 2.0], [0.1, 0.4, 0.3, 0.2]])
    assert M.keep_top(s, 0.5).tolist() == [[True, False, True, False], [False, True, True, False]]
    g = M.keep_global([s, 100 * s], 0.5)  # per-layer normalisation: scale-free
    assert g[0].tolist() == g[1].tolist() and all(k.any(1).all() for k in g)
    p = parse(env_raw("test"))
    m = tiny_lm(double=False)
    ids = torch.randint(0, 11, (4, 20), generator=torch.Generator().manual_seed(6))
    keeps, scores, secs = M.prune(m, "ghost", 0.5, ids, p, np.random.default_rng(0))
    assert all(int(k.sum()) == 2 * 3 for k in keeps) and secs > 0
    # layer 1's scores were taken on the network whose layer 0 is already pruned
    ref = tiny_lm(double=False)
    M.set_masks(ref, [keeps[0], torch.ones(2, 6, dtype=torch.bool)])
    expect = M.forward_score(M.forward_statistics(ref.layers[1], M.layer_input(ref, ids, 1)), "ghost")
    assert torch.allclose(scores[1], expect, rtol=1e-5)
    dense_l1 = M.forward_score(
        M.forward_statistics(tiny_lm(double=False).layers[1], M.layer_input(tiny_lm(double=False), ids, 1)), "ghost"
    )
    assert not torch.allclose(scores[1], dense_l1, rtol=1e-3)


# ------------------------------------------------------------------ data
def test_topic_corpus_follows_its_generative_rules():
    from pipelines.ghost.data import sample_topic_sequences, topic_world

    p = parse(env_raw("base"))
    world = topic_world(p)
    rng = np.random.default_rng(0)
    tok, _ = sample_topic_sequences(world, 64, 40, 0.0, rng)  # pure Markov chain
    assert all(tok[i, t] in world["succ"][tok[i, t - 1]] for i in range(64) for t in range(1, 40))
    tok, z = sample_topic_sequences(world, 400, 50, 1.0, rng)  # pure topic unigram
    k = int(np.bincount(z).argmax())
    freq = np.bincount(tok[z == k].ravel(), minlength=256) / tok[z == k].size
    top = np.argsort(world["unigram"][k])[::-1][:5]
    np.testing.assert_allclose(freq[top], world["unigram"][k][top], atol=0.01)


def test_user_corpus_is_checked_and_bad_files_name_dataset_and_column(tmp_path):
    from pipelines.ghost.data import load_user_corpus

    raw = env_raw("test")
    raw["data"] = {**raw["data"], "source": "file", "user_file": str(tmp_path / "c.parquet")}
    p = parse(raw)
    L, V = p.data.seq_len, p.data.vocab_size
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {"split": ["train", "val", "calib", "test"] * 3, "tokens": [rng.integers(0, V, L).tolist() for _ in range(12)]}
    )
    out = load_user_corpus(df, p)
    assert out["train"].shape == (3, L) and out["train"].dtype == torch.long
    with pytest.raises(InputDataError, match="'ghost.user_corpus': column 'tokens' is missing"):
        load_user_corpus(df.rename(columns={"tokens": "ids"}), p)
    bad = df.copy()
    bad.loc[0, "tokens"] = [V + 5] * L
    with pytest.raises(
        InputDataError,
        match=r"'ghost.user_corpus': column 'tokens' must be in \[0, \d+\]; \d+ value\(s\) are not \(first \d+ at row 0\)",
    ):
        load_user_corpus(bad, p)
    with pytest.raises(InputDataError, match="column 'split' has unknown value"):
        load_user_corpus(df.assign(split=["train", "dev", "calib", "test"] * 3), p)


# ------------------------------------------------------------------ pipeline and parameters
@pytest.mark.parametrize(
    "path,value,key",
    [
        (("prune", "rhos"), [0.5, 1.0], r"ghost\.prune\.rhos"),
        (("model", "n_groups"), 3, r"ghost\.model: .*n_groups"),
        (("eval", "main_variants"), ["dense", "ghost", "magic"], r"ghost\.eval\.main_variants: .*'magic'"),
        (("train", "steps"), True, r"ghost\.train\.steps"),
        (("prune", "n_calib_seqs"), 64, r"ghost: .*prune\.n_calib_seqs"),
        (("eval", "decode_rhos"), [0.9], r"ghost: .*eval\.decode_rhos"),
    ],
)
def test_bad_parameter_names_the_key(path, value, key):
    raw = copy.deepcopy(env_raw("base"))
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(ParameterError, match=key):
        parse(raw)


def test_report_of_the_test_env_run(test_env_run):
    report = test_env_run("ghost").report
    p = parse(env_raw("test"))
    assert set(report["variants"]) == set(p.variants)
    assert report["variants"]["ghost"]["kept_fraction_rho075"] == pytest.approx(0.25)
    assert report["metrics"]["truncation_max_abs_logit_diff"] < 1e-4
    assert report["metrics"]["state_bytes_per_seq.rho050"] == report["metrics"]["state_bytes_per_seq.dense"] / 2
    assert {c["id"] for c in report["claims"]} == {c.id for c in p.claims}


def test_claims_must_name_planned_variants_and_ratios():
    from pipelines.ghost.spec import SPEC

    raw = copy.deepcopy(env_raw("base"))
    raw["eval"]["main_variants"] = ["dense", "ghost", "taylor", "fisher"]
    # core's MethodParams check (any variants.<v>.* claim or gate) names it
    with pytest.raises(ParameterError, match="(claim|gate) '(state_matters|state_carries_information)'.*'random'"):
        parse(raw)
    raw = copy.deepcopy(env_raw("base"))
    raw["eval"]["decode_rhos"] = [0.5]
    with pytest.raises(ParameterError, match="claim 'pruned_decode_faster'.*rho075"):
        SPEC.check(parse(raw))
    raw = copy.deepcopy(env_raw("base"))
    raw["prune"]["rhos"] = [0.5]
    raw["eval"]["decode_rhos"] = [0.5]
    with pytest.raises(ParameterError, match="variant 'random' produces no metric 'delta_ppl_rho075'"):
        SPEC.check(parse(raw))
    raw = copy.deepcopy(env_raw("base"))
    raw["eval"]["loo_seqs"] = 0
    with pytest.raises(ParameterError, match="claim 'ghost_ranks_like_leave_one_out'.*spearman_vs_loo"):
        SPEC.check(parse(raw))
    SPEC.check(parse(env_raw("base")))


def test_derived_metrics_are_per_seed_and_paired():
    """Margins and ratios pair GHOST with each baseline seed by seed (the best gradient method chosen by its
    mean); the heavy tail is the worst case over seeds and ratios; the decode speed-up keeps its own interval."""
    from pipelines.core.spec import Results, SeedValues, compute_derived
    from pipelines.ghost.spec import SPEC

    raw = copy.deepcopy(env_raw("base"))
    raw["prune"].update(rhos=[0.75], extra_rhos=[])
    raw["eval"]["decode_rhos"] = [0.75]
    raw["claims"] = [c for c in raw["claims"] if "rho050" not in c["metric"]]
    p = parse(raw)
    d = {"ghost": (0.1, 0.3), "random": (2.0, 1.0), "taylor": (0.5, 0.1), "fisher": (0.2, 0.3)}
    tables = {"dense": Results("dense").add(0, test_ppl=40.0, delta_ppl=0.0).add(1, test_ppl=40.0, delta_ppl=0.0)}
    for v, xs in d.items():
        r = Results(v)
        for s, x in enumerate(xs):
            r.add(s, delta_ppl_rho075=x, top_half_mass_min_rho075=0.9 + 0.01 * s, calib_time_s_rho075=1.0 + s)
        tables[v] = r
    values = SeedValues({v: r.table() for v, r in tables.items()})
    timing = {"speedup": {"rho075": {"ratio": 1.3, "ci_low": 1.2, "ci_high": 1.4, "rounds": 9}}}
    loo = {"delta_nll": torch.zeros(0)}
    blob = {"history": torch.tensor([3.0, 2.0]), "dense_val_nll": torch.tensor(3.5)}
    point, per_seed = compute_derived(
        SPEC, p, values, list(tables), {"timing": timing, "loo": loo, "model_blob": blob, "artifacts": {}}
    )
    assert per_seed["margin.delta_ppl_rho075.ghost_minus_half_random"] == pytest.approx({0: -0.9, 1: -0.2})
    # Taylor's mean (0.3) beats Fisher's (0.25)? no: Fisher is the better gradient method, paired per seed
    assert per_seed["margin.delta_ppl_rho075.ghost_minus_1p2_best_gradient"] == pytest.approx(
        {0: 0.1 - 0.24, 1: 0.3 - 0.36}
    )
    assert per_seed["ratio.delta_ppl_rho075.ghost_vs_random"] == pytest.approx({0: 0.05, 1: 0.3})
    assert point["heavy_tail.ghost_top_half_mass_min"] == pytest.approx(0.9)
    assert per_seed["calib_speedup.ghost_vs_best_gradient"] == pytest.approx({0: 1.0, 1: 1.0})
    est = point["decode_speedup.rho075"]
    assert (est.value, est.lo, est.hi, est.n) == (1.3, 1.2, 1.4, 9)
    assert per_seed["dense_ppl_over_vocab"] == {0: 40.0 / 256, 1: 40.0 / 256}
    assert point["train_final_loss"] == 2.5 and point["dense_val_nll"] == 3.5
