"""Data nodes of `llds`: the environment (built-in synthetic KB, or a user KB and question table under
``data.source: file``), the SFT gold trajectories and the fixed greedy test episodes."""

from __future__ import annotations

import pandas as pd
import torch

from pipelines.core.api import InputDataError, TableSchema, read_user_file
from pipelines.llds.env import Env, builtin_env, gold_trajectories
from pipelines.llds.params import Params

FACTS = TableSchema(
    "llds.facts", {"subject": "str", "relation": "str", "object": "str"}, no_missing=("subject", "relation", "object")
)
QUESTIONS = TableSchema(
    "llds.questions",
    {"subject": "str", "relations": "str", "answer": "str"},
    min_rows=10,
    no_missing=("subject", "relations", "answer"),
)


# ------------------------------------------------------------------------------------------ env
def env_to_dict(env: Env, questions: dict | None = None) -> dict:
    return {
        "ent_names": env.ent_names,
        "ent_type": env.ent_type,
        "types": list(env.types),
        "rel_names": env.rel_names,
        "rel_dom": env.rel_dom,
        "rel_rng": env.rel_rng,
        "qtype_names": env.qtype_names,
        "qtype_chains": [list(c) for c in env.qtype_chains],
        "p_true": env.p_true,
        "n_facts": env.n_facts,
        "ood_obs": env.ood_obs,
        "fixed_kb": env.fixed_kb,
        "max_hops": env.max_hops,
        "questions": questions,
    }


def env_from_dict(d: dict) -> Env:
    return Env(
        ent_names=list(d["ent_names"]),
        ent_type=d["ent_type"],
        types=tuple(d["types"]),
        rel_names=list(d["rel_names"]),
        rel_dom=list(d["rel_dom"]),
        rel_rng=list(d["rel_rng"]),
        qtype_names=list(d["qtype_names"]),
        qtype_chains=[tuple(c) for c in d["qtype_chains"]],
        p_true=d["p_true"],
        n_facts=d["n_facts"],
        ood_obs=d["ood_obs"],
        fixed_kb=d["fixed_kb"],
        max_hops=d["max_hops"],
    )


def user_env(facts: pd.DataFrame, questions: pd.DataFrame, p: Params) -> dict:
    """A fixed user KB: entities are typed by the relations they take part in (an entity's type is the
    set of roles it plays, so distractors share the queried relation); question types are the distinct
    relation chains of the question table (``relations``: names joined by ``|``, at most 4 hops)."""
    FACTS.check(facts)
    QUESTIONS.check(questions)
    rels = sorted(facts["relation"].unique())
    ents = sorted(set(facts["subject"]) | set(facts["object"]))
    e_id = {e: i for i, e in enumerate(ents)}
    r_id = {r: i for i, r in enumerate(rels)}
    dup = facts.duplicated(["subject", "relation"])
    if dup.any():
        row = facts[dup].iloc[0]
        raise ValueError(
            f"dataset 'llds.facts': column 'object': ({row.subject}, {row.relation}) has two objects; "
            f"the tool needs a function per relation"
        )
    kb = torch.full((len(rels), len(ents)), -1, dtype=torch.long)
    kb[torch.tensor(facts["relation"].map(r_id).to_numpy()), torch.tensor(facts["subject"].map(e_id).to_numpy())] = (
        torch.tensor(facts["object"].map(e_id).to_numpy())
    )
    chains = questions["relations"].str.split("|")
    unknown = sorted({r for c in chains for r in c} - set(rels))
    if unknown:
        raise ValueError(
            f"dataset 'llds.questions': column 'relations' names relations absent from the facts: {unknown[:5]}"
        )
    missing = sorted(set(questions["subject"]) - set(ents))
    if missing:
        raise ValueError(
            f"dataset 'llds.questions': column 'subject' holds entities absent from the facts: {missing[:5]}"
        )
    max_hops = max(len(c) for c in chains)
    if max_hops > 4:
        raise ValueError("dataset 'llds.questions': column 'relations' chains more than 4 relations")
    qnames = sorted({"|".join(c) for c in chains})
    q_id = {q: i for i, q in enumerate(qnames)}
    # one "type" per relation role: an entity's type is the first relation it is a subject of (else object)
    ent_type = torch.full((len(ents),), len(rels), dtype=torch.long)
    for r in reversed(rels):
        ent_type[torch.tensor(facts.loc[facts.relation == r, "subject"].map(e_id).unique())] = r_id[r]
    rel_rng = []
    for r in rels:
        objs = facts.loc[facts.relation == r, "object"].map(e_id).to_numpy()
        rel_rng.append(int(torch.mode(ent_type[torch.tensor(objs)]).values))
    env = Env(
        ent_names=ents,
        ent_type=ent_type,
        types=tuple([*rels, "other"]),
        rel_names=rels,
        rel_dom=list(range(len(rels))),
        rel_rng=rel_rng,
        qtype_names=qnames,
        qtype_chains=[tuple(r_id[r] for r in q.split("|")) for q in qnames],
        p_true=p.data.p_true,
        n_facts=p.data.n_facts,
        ood_obs=p.data.ood_obs,
        fixed_kb=kb,
        max_hops=max_hops,
    )
    subj = torch.tensor(questions["subject"].map(e_id).to_numpy())
    answer = questions["answer"].map(e_id)
    if answer.isna().any():
        raise ValueError(
            f"dataset 'llds.questions': column 'answer' holds entities absent from the facts: "
            f"{questions.loc[answer.isna(), 'answer'].iloc[0]!r}"
        )
    q = torch.tensor(chains.map(lambda c: q_id["|".join(c)]).to_numpy())
    g = torch.Generator().manual_seed(p.data.eval_seed)
    test = torch.rand(len(q), generator=g) < p.data.test_fraction
    qs = {"subject": subj, "qtype": q, "answer": torch.tensor(answer.astype(int).to_numpy()), "test": test}
    return env_to_dict(env, qs)


def make_env(p: Params) -> dict:
    """data.env: the environment's spec (entities, relations, question types, the user KB if any)."""
    d = p.data
    if d.source == "file":
        facts = read_user_file(d.facts_path, key="llds.data.facts_path", kind="parquet")
        questions = read_user_file(d.questions_path, key="llds.data.questions_path", kind="parquet")
        return user_env(facts, questions, p)
    return env_to_dict(builtin_env(d.n_persons, d.n_cities, d.n_countries, d.n_orgs, d.p_true, d.n_facts, d.ood_obs))


def draw_episodes(
    spec: dict, n: int, gen: torch.Generator, split: str = "train", qtype: int | None = None
) -> dict[str, torch.Tensor]:
    """``n`` episodes: fresh KBs (built-in) or questions drawn from the user table's ``split``."""
    env = env_from_dict(spec)
    qs = spec.get("questions")
    if qs is None:
        return env.episodes(n, gen, qtype)
    pool = qs["test"] if split == "test" else ~qs["test"]
    if qtype is not None:
        pool = pool & (qs["qtype"] == qtype)
    rows = pool.nonzero()[:, 0]
    if not len(rows):
        what = f" of type '{env.qtype_names[qtype]}'" if qtype is not None else ""
        # the user's table is too small for its split (a DatasetError: the run stops in one line)
        raise InputDataError(
            f"dataset 'llds.questions (data.questions_path)': no {split} questions{what}; "
            f"give more rows of that type (the test split is a random data.test_fraction "
            f"of the questions)"
        )
    pick = rows[torch.randint(len(rows), (n,), generator=gen)]
    return env.episodes_from(qs["subject"][pick], qs["qtype"][pick], env.sample_kb(n, gen), qs["answer"][pick])


def sft_trajectories(spec: dict, p: Params) -> dict[str, torch.Tensor]:
    """data.sft_trajectories: one fresh gold trajectory per SFT example (answers corrupted at rate
    ``sft.corrupt``)."""
    g = torch.Generator().manual_seed(p.sft.seed)
    ep = draw_episodes(spec, p.sft.steps * p.sft.batch_size, g)
    b = gold_trajectories(env_from_dict(spec), ep, g, p.sft.corrupt)
    return {"ids": b.ids, "mask": b.mask, "reward": b.reward}


def qa_test(spec: dict, p: Params) -> dict[str, torch.Tensor]:
    """data.qa_test: ``n_test_per_type`` held-out episodes per question type (fresh KBs), identical for
    every variant and every evaluation."""
    env = env_from_dict(spec)
    g = torch.Generator().manual_seed(p.data.eval_seed)
    eps = [draw_episodes(spec, p.data.n_test_per_type, g, "test", k) for k in range(len(env.qtype_names))]
    return {k: torch.cat([e[k] for e in eps]) for k in eps[0]}
