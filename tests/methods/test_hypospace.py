"""Tests of `hypospace`: enumerators against brute force (networkx for DAGs, every voxel array, every
binary expression tree), validators against perturbed hypotheses, the reference samplers against their
exact expectations, the metric definitions, the LLM sampler against a stub server, and bad input (the
plain end-to-end --env=test run is covered by tests/methods/test_all_pipelines.py)."""

import itertools
import json
import math

import networkx as nx
import numpy as np
import pandas as pd
import pytest
import yaml

from pipelines.core.params import ParameterError, validate
from pipelines.hypospace import domains as D
from pipelines.hypospace.params import Params
from tests.conftest import ROOT


def raw_params(env: str = "test") -> dict:
    base = yaml.safe_load((ROOT / "conf/base/parameters_hypospace.yml").read_text())["hypospace"]
    delta = yaml.safe_load((ROOT / f"conf/{env}/parameters_hypospace.yml").read_text())["hypospace"]

    def merge(a, b):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return merge(base, delta)


# ------------------------------------------------------------------------------------ causal
@pytest.mark.parametrize("n, count", [(2, 3), (3, 25), (4, 543)])
def test_dag_enumerator_matches_brute_force_over_all_digraphs(n, count):
    dom = D.Causal(n)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    brute = {}
    for sub in range(1 << len(pairs)):
        g = nx.DiGraph([pairs[k] for k in range(len(pairs)) if sub >> k & 1])
        g.add_nodes_from(range(n))
        if nx.is_directed_acyclic_graph(g):
            brute[dom.key(frozenset(g.edges))] = [sum(1 << c for c in nx.descendants(g, v)) for v in range(n)]
    assert len(dom.keys) == len(set(dom.keys)) == count == len(brute)  # OEIS A003024
    assert set(dom.keys) == set(brute)
    for k, row in zip(dom.keys, dom.desc):
        assert list(row) == brute[k]


def test_causal_admissible_sets_match_brute_force_filtering():
    dom = D.Causal(4)
    rng = np.random.default_rng(0)
    graphs = {k: dom.from_key(k) for k in dom.keys}
    for _ in range(25):
        t = int(rng.integers(dom.space_size))
        obs = dom.make_obs(t, rng.choice(4, size=int(rng.integers(1, 4)), replace=False))
        want = set()
        for k, edges in graphs.items():
            g = nx.DiGraph(list(edges))
            g.add_nodes_from(range(4))
            if all(nx.descendants(g, int(v)) == set(d) for v, d in obs["perturbed"].items()):
                want.add(k)
        assert {dom.keys[i] for i in dom.admissible(obs)} == want and dom.keys[t] in want


def test_causal_validator_rejects_perturbed_graphs():
    dom = D.Causal(4)
    rng = np.random.default_rng(1)
    n_rejected = 0
    for _ in range(20):
        obs = dom.make_obs(int(rng.integers(dom.space_size)), rng.choice(4, size=2, replace=False))
        A = {dom.keys[i] for i in dom.admissible(obs)}
        for k in list(A)[:10]:
            h = dom.from_key(k)
            assert dom.validate(h, obs)
            bad = dom.perturb(h, rng)
            assert dom.validate(bad, obs) == (dom.key(bad) in A)
            n_rejected += dom.key(bad) not in A
    assert n_rejected > 50
    obs = {"n": 4, "perturbed": {"0": [1]}}
    assert dom.validate(frozenset({(0, 1)}), obs)
    assert not dom.validate(frozenset({(0, 1), (1, 0)}), obs)  # a cycle
    assert not dom.validate(frozenset({(0, 1), (1, 2)}), obs)  # 2 is also a descendant of 0
    assert not dom.validate(frozenset({(0, 0)}), obs) and not dom.validate(None, obs)


# ------------------------------------------------------------------------------------ voxel3d
@pytest.mark.parametrize("g, H", [(2, 2), (2, 3)])
def test_voxel_enumerator_matches_brute_force_over_all_voxel_arrays(g, H):
    dom = D.Voxel3D(g, H)
    arrays = [np.array(bits, dtype=bool).reshape(H, g, g) for bits in itertools.product((0, 1), repeat=H * g * g)]
    for top in itertools.product((0, 1), repeat=g * g):
        if not any(top):
            continue
        obs = {"grid": g, "max_height": H, "top": np.array(top).reshape(g, g).tolist()}
        brute = {dom.key(a) for a in arrays if dom.validate(a, obs)}
        hs = dom.admissible_heights(np.array(top))
        keys = {"/".join("".join(map(str, r)) for r in h.reshape(g, g)) for h in hs}
        assert keys == brute and len(keys) == H ** sum(top)
    # heights above H, floating blocks and a wrong top view are rejected
    obs = {"grid": 2, "max_height": H, "top": [[1, 0], [0, 0]]}
    assert dom.validate(dom.from_key("10/00"), obs) and dom.validate(dom.from_key(f"{H}0/00"), obs)
    assert not dom.validate(dom.from_key(f"{H + 1}0/00"), obs)
    floating = np.zeros((2, 2, 2), dtype=bool)
    floating[0, 0, 0] = floating[1, 0, 0] = floating[1, 0, 1] = True
    assert not dom.validate(floating, {"grid": 2, "max_height": H, "top": [[1, 1], [0, 0]]})
    assert dom.key(floating).startswith("layers:")


def test_voxel_validator_rejects_perturbed_structures():
    dom = D.Voxel3D(3, 3)
    rng = np.random.default_rng(2)
    top = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0]])
    obs = {"grid": 3, "max_height": 3, "top": top.tolist()}
    A = {"/".join("".join(map(str, r)) for r in h.reshape(3, 3)) for h in dom.admissible_heights(top)}
    assert len(A) == 27
    rejected = 0
    for k in A:
        v = dom.from_key(k)
        assert dom.validate(v, obs) and dom.key(v) == k
        for _ in range(3):
            bad = dom.perturb(v, rng)
            assert dom.validate(bad, obs) == (dom.key(bad) in A)
            rejected += dom.key(bad) not in A
    assert rejected > 40


# ------------------------------------------------------------------------------------ boolean
def all_trees(variables, ops, depth):
    """Every binary AST of depth <= depth, as nested tuples (no deduplication at all)."""
    trees = [("VAR", v) for v in variables]
    for _ in range(depth):
        prev = trees
        trees = list(prev)
        if "NOT" in ops:
            trees += [("NOT", a) for a in prev]
        for op in ops:
            if op != "NOT":
                trees += [(op, a, b) for a in prev for b in prev]
        trees = list(dict.fromkeys(trees))
    return trees


def tree_key(t):
    if t[0] == "VAR":
        return D.var(t[1])
    return D.make(t[0], tuple(tree_key(c) for c in t[1:]))


def tree_eval(t, env):
    if t[0] == "VAR":
        return env[t[1]]
    vals = [tree_eval(c, env) for c in t[1:]]
    return {
        "NOT": lambda: 1 - vals[0],
        "AND": lambda: vals[0] & vals[1],
        "OR": lambda: vals[0] | vals[1],
        "XOR": lambda: vals[0] ^ vals[1],
        "NOR": lambda: 1 - (vals[0] | vals[1]),
    }[t[0]]()


@pytest.mark.parametrize("ops", ["basic", "extended"])
def test_boolean_enumerator_matches_brute_force_over_all_trees(ops):
    V = ("x", "y")
    dom = D.Boolean(V, ops, 2)
    trees = all_trees(V, D.OPERATOR_SETS[ops], 2)
    by_key = {}
    for t in trees:
        by_key.setdefault(tree_key(t).text, []).append(t)
    assert set(dom.keys) == set(by_key) and len(dom.keys) == len(set(dom.keys))
    rng = np.random.default_rng(3)
    for k in dom.keys:
        e = D.parse_expr(k)
        assert e.text == k and D.depth(e) <= 2  # rendering round-trips; key depth <= D
    for _ in range(12):  # A(obs) = keys of consistent trees
        rows = rng.choice(4, size=int(rng.integers(1, 4)), replace=False)
        truth = by_key[dom.keys[int(rng.integers(dom.space_size))]][0]
        obs_rows = [[r >> 1 & 1, r & 1, tree_eval(truth, {"x": r >> 1 & 1, "y": r & 1})] for r in sorted(rows)]
        want = {
            k for k, ts in by_key.items() if all(tree_eval(ts[0], {"x": a, "y": b}) == out for a, b, out in obs_rows)
        }
        obs = {"rows": obs_rows}
        assert {dom.keys[i] for i in dom.admissible(obs)} == want
        assert all(dom.validate(D.parse_expr(k), obs) for k in want)


def test_boolean_mechanistic_key_rules():
    k = lambda s: D.parse_expr(s).text  # noqa: E731
    assert k("x AND y") == k("y AND x") == k("(x AND y) AND x") == k("AND(y, x, y)")  # comm., idem., assoc.
    assert k("(x OR y) OR NOT x") == k("x OR (NOT x OR y)")
    assert k("(x AND y) OR y") != k("x AND (y OR y)")  # no distributivity / absorption
    assert k("NOT (x AND y)") != k("NOT x OR NOT y")  # no De Morgan
    assert k("x XOR x") != k("x") and k("(x XOR y) XOR x") == k("x XOR (x XOR y)")
    assert k("(x NOR y) NOR y") != k("x NOR (y NOR y)")  # NOR is not associative
    assert k("x ∧ ¬y") == k("\\(x \\land \\lnot y\\)") == k("x & !y") == k("NOT y AND x")
    assert D.parse_expr("x AND (y") is None and D.parse_expr("x y") is None


def test_boolean_validator_rejects_perturbed_and_out_of_space_expressions():
    dom = D.Boolean(("x", "y"), "extended", 2)
    rng = np.random.default_rng(4)
    obs = {"rows": [[0, 1, 1], [1, 1, 0]]}
    A = {dom.keys[i] for i in dom.admissible(obs)}
    rejected = 0
    for k in A:
        bad = dom.perturb(D.parse_expr(k), rng)
        assert dom.validate(bad, obs) == (bad.text in A)
        rejected += bad.text not in A
    assert rejected > len(A) // 4
    basic = D.Boolean(("x", "y"), "basic", 2)
    o = {"rows": [[1, 0, 1]]}
    assert basic.validate(D.parse_expr("x AND NOT y"), o)
    assert not basic.validate(D.parse_expr("x XOR y"), o)  # operator not allowed
    assert not basic.validate(D.parse_expr("x OR 1"), o)  # constants are outside the space
    assert not basic.validate(D.parse_expr("x AND NOT NOT NOT y"), o)  # depth 4 > 2
    assert not basic.validate(D.parse_expr("x AND z"), o)  # unknown variable


def test_llm_answer_parsers_are_tolerant_and_round_trip():
    c, v, b = D.Causal(3), D.Voxel3D(2, 2), D.Boolean(("x", "y"), "basic", 2)
    assert c.key(c.parse_text("Sure!\nGraph: A -> B, B→C")) == "A->B,B->C"
    assert c.key(c.parse_text("graph: none")) == "none" and c.parse_text("no idea") is None
    assert v.key(v.parse_text("Structure:\nLayer 1: [[1,1],[0,0]]\nLayer 2:\n10\n00")) == "21/00"
    assert v.parse_text("Structure:\nLayer 1:\n1 2\n0 0") is None and v.parse_text("a tower") is None
    assert b.parse_text("Expression: $x \\lor \\neg y$").text == "(NOT y OR x)"
    for dom, keys in ((c, c.keys), (b, b.keys), (v, ["21/00", "00/01", "22/11"])):
        for k in keys:  # what the prompt shows parses back to the same key
            assert dom.key(dom.parse_text(dom.render(dom.from_key(k)))) == k


# ------------------------------------------------------------------------------------ samplers
def test_uniform_recovery_matches_exact_expectation():
    from pipelines.hypospace.evaluate import distinct_count_pmf, uniform_recovery_moments
    from pipelines.hypospace.samplers import offline_proposals

    p = Params.model_validate(raw_params())
    rng = np.random.default_rng(5)
    for K, m in [(1, 1), (2, 1), (7, 1), (40, 1), (40, 2), (150, 1)]:
        N = math.ceil(m * K)
        keys = [f"h{i}" for i in range(K)]
        reps = 3000 if K < 100 else 800
        R = np.array(
            [
                len(
                    set(
                        offline_proposals(
                            "uniform_valid", None, keys, np.zeros(K), np.zeros(K), N, rng, np.zeros(K), p.samplers, 10
                        )
                    )
                )
                / K
                for _ in range(reps)
            ]
        )
        mean, var = uniform_recovery_moments(K, N)
        assert mean == pytest.approx(1 - (1 - 1 / K) ** N)
        pmf = distinct_count_pmf(K, N)  # the occupancy recursion agrees with the closed form
        assert (pmf * np.arange(K + 1)).sum() / K == pytest.approx(mean, abs=1e-12)
        se = math.sqrt(var / reps)
        assert abs(R.mean() - mean) <= 4 * se + 1e-12, (K, m, R.mean(), mean)
    assert uniform_recovery_moments(10_000, 10_000)[0] == pytest.approx(1 - math.exp(-1), abs=1e-4)


def test_prior_validity_enumerate_and_zero_temperature_limits():
    from pipelines.hypospace.samplers import offline_proposals, preference

    p = Params.model_validate(raw_params())
    dom = D.Causal(3)
    obs = {"n": 3, "perturbed": {"1": []}}
    idx = dom.admissible(obs)
    keys = [dom.keys[i] for i in idx]
    K, N, rng = len(keys), 4000, np.random.default_rng(6)
    props = offline_proposals(
        "uniform_prior", dom, keys, dom.complexity(idx), dom.stratum(idx), N, rng, np.zeros(K), p.samplers, 10
    )
    V = np.mean([dom.validate(dom.from_key(k), obs) for k in props])
    q = K / dom.space_size
    assert abs(V - q) <= 4 * math.sqrt(q * (1 - q) / N)
    enum = offline_proposals("enumerate", dom, keys, None, None, K - 2, rng, None, p.samplers, 10)
    assert len(set(enum)) == K - 2  # R = min(1, N/|A|)
    cold = p.samplers.model_copy(update={"temperature": 1e-6})
    eta = preference(keys, 0, 1.0)
    mc = offline_proposals("mode_collapse", dom, keys, dom.complexity(idx), dom.stratum(idx), 50, rng, eta, cold, 10)
    assert len(set(mc)) == 1  # T → 0: deterministic
    st = offline_proposals("stratified", dom, keys, dom.complexity(idx), dom.stratum(idx), 50, rng, eta, cold, 10)
    assert len(set(st)) == len(set(dom.stratum(idx)))  # one per stratum at T → 0
    assert np.allclose(eta, preference(keys, 0, 1.0)) and not np.allclose(eta, preference(keys, 1, 1.0))
    z = preference([f"k{i}" for i in range(20000)], 3, 1.0)
    assert abs(z.mean()) < 0.04 and abs(z.std() - 1) < 0.04  # a standard normal


def test_history_avoid_and_stratified_behave_as_specified():
    from pipelines.hypospace.samplers import offline_proposals, preference

    p = Params.model_validate(raw_params())
    dom = D.Causal(4)
    obs = {"n": 4, "perturbed": {"3": []}}
    idx = dom.admissible(obs)
    keys = [dom.keys[i] for i in idx]
    cx, st, eta = dom.complexity(idx), dom.stratum(idx), preference(keys, 0, 1.0)
    rng = np.random.default_rng(7)
    obey = p.samplers.model_copy(update={"p_obey": 1.0, "max_redraws": 100, "temperature": 1.0})
    ha = offline_proposals("history_avoid", dom, keys, cx, st, 200, rng, eta, obey, 3)
    uniques = []
    for k in ha:  # never proposes one of the last 3 unique proposals (first-seen order)
        assert k not in uniques[-3:]
        uniques += [k] if k not in uniques else []
    assert len(uniques) > 10
    never = p.samplers.model_copy(update={"p_obey": 0.0})
    mc = offline_proposals("mode_collapse", dom, keys, cx, st, 300, np.random.default_rng(8), eta, never, 10)
    ha0 = offline_proposals("history_avoid", dom, keys, cx, st, 300, np.random.default_rng(8), eta, never, 10)
    assert len(set(ha0)) == pytest.approx(len(set(mc)), abs=3)  # p_obey = 0: plain mode_collapse
    sf = offline_proposals("stratified", dom, keys, cx, st, 70, rng, eta, p.samplers, 10)
    levels = sorted(set(st.tolist()))
    got = [bin(int(dom.masks[dom.keys.index(k)])).count("1") for k in sf]
    assert got == [levels[q % len(levels)] for q in range(70)]  # strata visited round-robin


# ------------------------------------------------------------------------------------ metrics
def test_metric_definitions_on_a_hand_made_proposal_table():
    from pipelines.hypospace.evaluate import set_metrics

    raw = raw_params()
    raw["domains"]["enabled"] = ["causal"]
    raw["variants"] = ["uniform_valid"]
    raw["claims"], raw["gates"] = [], []
    p = Params.model_validate(raw)
    obs = pd.DataFrame(
        [
            {
                "domain": "causal",
                "config": "n3_o1",
                "domain_config": '{"n": 3}',
                "seed": 0,
                "obs_id": "s",
                "obs": "{}",
                "n_admissible": 3,
                "space_size": 25,
                "truth": "a",
            }
        ]
    )
    adm = pd.DataFrame({"obs_id": "s", "seed": 0, "key": ["a", "b", "c"], "complexity": 0.0, "stratum": 0})
    props = pd.DataFrame(
        {
            "seed": 0,
            "domain": "causal",
            "config": "n3_o1",
            "obs_id": "s",
            "query": range(5),
            "key": ["a", "a", "z", "", "b"],
            "parsed": [True, True, True, False, True],
            "valid": [True, True, False, False, True],
            "n_budget": 5,
            "attempts": 1,
            "text": "",
        }
    )
    tables = {"causal_obs": obs, "causal_admissible": adm}
    m = set_metrics(p, "uniform_valid", props, tables).iloc[0]
    assert m["V"] == 3 / 5 and m["U"] == 3 / 5 and m["R"] == 2 / 3 and m["parse_rate"] == 4 / 5
    props.loc[2, "valid"] = True  # a "valid" key outside A: validator/enumerator disagree
    with pytest.raises(ValueError, match="observation set s.*disagree"):
        set_metrics(p, "uniform_valid", props, tables)


# ------------------------------------------------------------------------------------ LLM sampler
def test_llm_sampler_against_a_stub_server(tmp_path, monkeypatch):
    from pipelines.core.llm import LLMError, completion, stub_server
    from pipelines.hypospace.samplers import llm_client, llm_proposals

    answers = [
        "I am not sure.",
        "Graph: A->B",
        "graph: A -> B",
        "Graph: A->B, B->A",
        "```Graph: A→C, A->B```",
        "Graph: none",
    ]
    state = {"i": 0}

    def respond(body):
        text = answers[state["i"] % len(answers)]
        state["i"] += 1
        return completion([text])

    monkeypatch.setenv("HS_TEST_KEY", "secret")
    dom = D.Causal(3)
    obs = {"n": 3, "perturbed": {"0": [1]}}
    raw = raw_params()
    with stub_server(respond) as s:
        raw["llm"] = {
            **raw["llm"],
            "base_url": s.url,
            "cache_path": str(tmp_path / "cache.jsonl"),
            "api_key_env": "HS_TEST_KEY",
            "retries": 2,
        }
        p = Params.model_validate(raw)
        client = llm_client(p.llm)
        assert client.api_key == "secret"
        out = llm_proposals(dom, obs, 5, client, p.llm, 10, 0, "set0")
        sent = list(s.requests)
    keys = [dom.key(o) if o is not None else None for _, o, _ in out]
    assert keys == ["A->B", "A->B", "A->B,B->A", "A->B,A->C", "none"]
    assert out[0][2] == 2  # re-asked after the unparsable answer
    assert [dom.validate(o, obs) for _, o, _ in out] == [True, True, False, False, False]
    assert len(sent) == 6 and all(r["model"] == p.llm.model and r["temperature"] == p.llm.temperature for r in sent)
    prompts = [r["messages"][-1]["content"] for r in sent]
    assert "Graph: A->B" not in prompts[0] and "Graph: A->B" in prompts[2]  # history fed back
    assert "Graph: A->B,B->A" in prompts[-1]
    assert len({r["seed"] for r in sent}) == 6  # every query / attempt is its own request
    # the cache replays the run without the endpoint; a new request fails closed naming the parameter
    raw["llm"] = {**raw["llm"], "base_url": None}
    offline = llm_client(Params.model_validate(raw).llm)
    again = llm_proposals(dom, obs, 5, offline, p.llm, 10, 0, "set0")
    assert [dom.key(o) if o is not None else None for _, o, _ in again] == keys and offline.calls == 0
    with pytest.raises(LLMError, match=r"hypospace\.llm\.base_url is not set"):
        llm_proposals(dom, obs, 1, offline, p.llm, 10, 0, "another set")


def test_llm_variant_end_to_end_with_the_stub(run_pipeline):
    """`llm` is off by default; enabled through --params with the stub's URL it is one more train node."""
    from pipelines.core.llm import completion, stub_server

    def respond(body):
        prompt = body["messages"][-1]["content"]
        if "Graph" in prompt:
            return completion(["Graph: A->B"])
        if "Structure" in prompt:
            return completion(["Structure:\nLayer 1:\n1 1 0\n0 0 0\n0 0 0"])
        return completion(["Expression: x AND NOT y"])

    raw = raw_params()
    assert "llm" not in raw["variants"]
    variants = ",".join([*raw["variants"], "llm", "llm_stratified"])
    from pipelines.core.registry import load_pipeline

    with stub_server(respond) as s:
        run = run_pipeline(
            "hypospace",
            "test",
            [
                "--params",
                f"hypospace.variants=[{variants}],"
                f"hypospace.llm.base_url={s.url},hypospace.llm.max_queries=3,"
                "hypospace.llm.max_sets_per_config=2",
            ],
        )
        prompts = [r["messages"][-1]["content"] for r in s.requests]
    # the run's --params do not leak into pipelines built afterwards in this process
    assert "hypospace.train.llm" not in {n.name for n in load_pipeline("hypospace").nodes}
    r = run.report
    hinted = sum("exactly" in q for q in prompts)  # llm_stratified names the target stratum
    assert r["variants"]["llm"]["parse_rate"] == 1.0 and 0 <= r["variants"]["llm"]["V"] <= 1
    assert 0 < len(prompts) - hinted <= 3 * 2 * 4  # capped: 3 queries x 2 sets x 4 configurations
    assert r["variants"]["llm"]["n_queries"] == len(prompts) - hinted
    assert r["variants"]["llm_stratified"]["n_queries"] == hinted > 0
    assert r["variants"]["enumerate"]["R"] == 1.0 and r["variants"]["uniform_valid"]["V"] == 1.0


# ------------------------------------------------------------------------------------ bad input
def test_bad_parameters_name_the_key():
    raw = raw_params()
    with pytest.raises(ParameterError, match=r"hypospace\.variants"):
        validate(Params, {**raw, "variants": ["uniform_valid", "beam_search"]}, "hypospace")
    bad = json.loads(json.dumps(raw))
    bad["domains"]["causal"]["n_nodes"] = [6]
    with pytest.raises(ParameterError, match=r"hypospace\.domains\.causal\.n_nodes"):
        validate(Params, bad, "hypospace")
    bad = json.loads(json.dumps(raw))
    bad["samplers"]["temperature"] = 0
    with pytest.raises(ParameterError, match=r"hypospace\.samplers\.temperature"):
        validate(Params, bad, "hypospace")
    bad = json.loads(json.dumps(raw))
    bad["llm"]["api_key"] = "sk-123"  # keys never live in a parameters file
    with pytest.raises(ParameterError, match=r"hypospace\.llm\.api_key: unknown key"):
        validate(Params, bad, "hypospace")
    from pipelines.hypospace.spec import SPEC

    with pytest.raises(ParameterError, match="'stratified', which this run does not plan"):  # a gate on it
        validate(Params, {**raw, "variants": ["uniform_valid", "uniform_prior", "mode_collapse"]}, "hypospace")
    fewer = validate(
        Params,
        {
            **raw,
            "gates": [],
            "claims": [{**c, "requires": []} for c in raw["claims"]],
            "variants": ["uniform_valid", "uniform_prior", "mode_collapse"],
        },
        "hypospace",
    )
    with pytest.raises(ParameterError, match="claim 'causal_stratified_beats_mode_collapse'.*stratified"):
        SPEC.check(fewer)  # before any node runs (core: Method.check)


def test_bad_user_observation_file_names_dataset_and_column(tmp_path):
    from pipelines.core.schemas import InputDataError
    from pipelines.hypospace.data import make_domain_data

    f = tmp_path / "obs.csv"
    pd.DataFrame({"domain": ["causal"], "config": ["n3"], "obs_id": ["a"], "obs": ['{"n": 3}']}).to_csv(f, index=False)
    raw = raw_params()
    raw["user_observations"] = str(f)
    p = Params.model_validate(raw)
    with pytest.raises(InputDataError, match=r"hypospace\.user_observations.*column 'domain_config' is missing"):
        make_domain_data(p, "causal")
    pd.DataFrame(
        {
            "domain": ["causal"],
            "config": ["n3"],
            "domain_config": ['{"n": 3}'],
            "obs_id": ["a"],
            "obs": ['{"n": 3, "perturbed": {"0": [1, 2]}}'],
        }
    ).to_csv(f, index=False)
    o, a = make_domain_data(p, "causal")
    assert set(o["n_admissible"]) == {len(a) // len(p.seeds)} and len(a) > 0
    pd.DataFrame(
        {
            "domain": ["causal"],
            "config": ["n3"],
            "domain_config": ['{"n": 3}'],
            "obs_id": ["a"],
            "obs": ['{"n": 3, "perturbed": {"0": [1], "1": [0]}}'],
        }
    ).to_csv(f, index=False)
    with pytest.raises(InputDataError, match="admits no hypothesis"):
        make_domain_data(p, "causal")
    pd.DataFrame(
        {
            "domain": ["causal"],
            "config": ["n3"],
            "domain_config": ['{"n": 3}'],
            "obs_id": ["a"],
            "obs": ['{"n": 3, "perturbed": 1'],
        }
    ).to_csv(f, index=False)
    with pytest.raises(
        InputDataError, match=r"column 'obs' should be json, got text that is not JSON .*\(first at row 0\)"
    ):
        make_domain_data(p, "causal")
    pd.DataFrame(
        {"domain": ["causal"], "config": ["n3"], "domain_config": ['{"n": 3}'], "obs_id": ["a"], "obs": ['{"n": 3}']}
    ).to_csv(f, index=False)
    with pytest.raises(InputDataError, match=r"hypospace\.causal_obs.*set a:.*'obs'"):
        make_domain_data(p, "causal")


def test_validity_gate_fails_when_only_valid_by_construction_samplers_run():
    """Issue 22: the offline samplers draw from A (V = 1 by construction), so the gate a validity claim
    must require fails unless a free-text (LLM) sampler is planned, and the base parameters declare it."""
    import yaml

    from pipelines.hypospace.spec import free_text_samplers

    raw = raw_params()
    offline = validate(Params, raw, "hypospace")
    assert free_text_samplers({}, offline) == {"harness.free_text_samplers": 0.0}
    with_llm = validate(Params, {**raw, "variants": [*raw["variants"], "llm"]}, "hypospace")
    assert free_text_samplers({}, with_llm)["harness.free_text_samplers"] == 1.0
    base = yaml.safe_load(open("conf/base/parameters_hypospace.yml"))["hypospace"]
    [gate] = [g for g in base["gates"] if g["id"] == "validity_measured_on_a_free_text_sampler"]
    assert (gate["metric"], gate["op"], gate["threshold"]) == ("harness.free_text_samplers", ">=", 1.0)
    assert all(c["text"].startswith("harness check") for c in base["claims"])
