"""The synthetic tool-integrated (search) QA environment standing in for Search-R1: multi-hop questions
over a knowledge base, answered by issuing ``SEARCH ENT REL /SEARCH`` actions whose results come back as
loss-masked ``INFO`` blocks, then ``ANSWER X /ANSWER EOS``; reward = exact match of X.

Every turn has a fixed length (an action is 4 tokens, an info block 2 + 3·n_facts), so a batch of
rollouts decodes in lock step with the KV cache. The built-in KB is redrawn per episode (a tiny policy
memorises a fixed KB and never reads the tool); a user KB (``--env=full``) stays fixed."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# token layout
PAD, BOS, EOS = 0, 1, 2
SEARCH, END_SEARCH, ANSWER, END_ANSWER, INFO, END_INFO, NOHOP = 3, 4, 5, 6, 7, 8, 9
N_FIXED = 10
ACTION_LEN = 4

TYPES = ("person", "city", "country", "org")
# the built-in relations: name, domain type, range type
RELATIONS = (
    ("born_in", "person", "city"),
    ("city_in", "city", "country"),
    ("works_for", "person", "org"),
    ("org_hq", "org", "city"),
)
# the built-in question types as relation chains over a person
QTYPES = {"1hop": ("born_in",), "2hop_a": ("born_in", "city_in"), "2hop_b": ("works_for", "org_hq")}


@dataclass
class Env:
    """Entities (typed), relations, question types (relation chains) and the token layout.

    ``fixed_kb`` [R, E] (object entity or −1) is the user's KB; None: a fresh KB per episode."""

    ent_names: list[str]
    ent_type: torch.Tensor  # [E] index into types
    types: tuple[str, ...]
    rel_names: list[str]
    rel_dom: list[int]
    rel_rng: list[int]
    qtype_names: list[str]
    qtype_chains: list[tuple[int, ...]]  # relation indices
    p_true: float = 0.9
    n_facts: int = 3
    ood_obs: bool = False
    fixed_kb: torch.Tensor | None = None
    max_hops: int = 2
    subj_cands: torch.Tensor = field(init=False)  # [R, Cmax] candidate subjects per relation (−1 padded)
    n_cands: torch.Tensor = field(init=False)  # [R]

    def __post_init__(self):
        cands = []
        for r in range(self.n_rel):
            if self.fixed_kb is not None:
                c = (self.fixed_kb[r] >= 0).nonzero()[:, 0]
            else:
                c = (self.ent_type == self.rel_dom[r]).nonzero()[:, 0]
            cands.append(c)
        cmax = max(len(c) for c in cands)
        self.subj_cands = torch.full((self.n_rel, cmax), -1, dtype=torch.long)
        for r, c in enumerate(cands):
            self.subj_cands[r, : len(c)] = c
        self.n_cands = torch.tensor([len(c) for c in cands])
        if int(self.n_cands.min()) < self.n_facts + 1:
            bad = self.rel_names[int(self.n_cands.argmin())]
            raise ValueError(
                f"relation {bad!r} has {int(self.n_cands.min())} subjects; the tool needs at least "
                f"n_facts + 1 = {self.n_facts + 1} to draw distractors"
            )

    # ------------------------------------------------------------------ layout
    @property
    def n_ent(self) -> int:
        return len(self.ent_names)

    @property
    def n_rel(self) -> int:
        return len(self.rel_names)

    @property
    def rel_base(self) -> int:
        return N_FIXED

    @property
    def ent_base(self) -> int:
        return N_FIXED + self.n_rel

    @property
    def obs_base(self) -> int:
        """Where info blocks write entities: ids the policy never emits when ``ood_obs``."""
        return self.ent_base + (self.n_ent if self.ood_obs else 0)

    @property
    def vocab_size(self) -> int:
        return self.ent_base + self.n_ent * (2 if self.ood_obs else 1)

    @property
    def info_len(self) -> int:
        return 2 + 3 * self.n_facts

    @property
    def prompt_len(self) -> int:
        return 2 + self.max_hops

    @property
    def max_turns(self) -> int:
        return self.max_hops + 1

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.max_turns * ACTION_LEN + (self.max_turns - 1) * self.info_len

    def token_names(self) -> list[str]:
        names = ["<pad>", "<bos>", "<eos>", "SEARCH", "/SEARCH", "ANSWER", "/ANSWER", "INFO", "/INFO", "NOHOP"]
        names += self.rel_names + self.ent_names
        if self.ood_obs:
            names += [f"{e}'" for e in self.ent_names]
        return names

    def is_entity_token(self, t: torch.Tensor) -> torch.Tensor:
        return (t >= self.ent_base) & (t < self.ent_base + self.n_ent)

    def is_relation_token(self, t: torch.Tensor) -> torch.Tensor:
        return (t >= self.rel_base) & (t < self.rel_base + self.n_rel)

    # ------------------------------------------------------------------ episodes
    def sample_kb(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, R, E] object entity of (relation, subject), −1 where the relation does not apply."""
        if self.fixed_kb is not None:
            return self.fixed_kb[None].expand(n, -1, -1)
        kb = torch.full((n, self.n_rel, self.n_ent), -1, dtype=torch.long)
        for r in range(self.n_rel):
            dom = (self.ent_type == self.rel_dom[r]).nonzero()[:, 0]
            rng_ents = (self.ent_type == self.rel_rng[r]).nonzero()[:, 0]
            pick = torch.randint(len(rng_ents), (n, len(dom)), generator=gen)
            kb[:, r, dom] = rng_ents[pick]
        return kb

    def episodes(self, n: int, gen: torch.Generator, qtype: int | None = None) -> dict[str, torch.Tensor]:
        """``n`` fresh episodes: prompt ids [n, P], KB [n, R, E], question type [n], gold answer [n]
        (entity index). Built-in KB only (a user KB draws from its question table: ``episodes_from``)."""
        kb = self.sample_kb(n, gen)
        q = (
            torch.randint(len(self.qtype_chains), (n,), generator=gen)
            if qtype is None
            else torch.full((n,), qtype, dtype=torch.long)
        )
        subj = torch.empty(n, dtype=torch.long)
        for k, chain in enumerate(self.qtype_chains):
            rows = (q == k).nonzero()[:, 0]
            if len(rows):
                dom = (self.ent_type == self.rel_dom[chain[0]]).nonzero()[:, 0]
                subj[rows] = dom[torch.randint(len(dom), (len(rows),), generator=gen)]
        return self.episodes_from(subj, q, kb)

    def episodes_from(
        self, subj: torch.Tensor, q: torch.Tensor, kb: torch.Tensor, answer: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        n = len(subj)
        prompt = torch.full((n, self.prompt_len), NOHOP, dtype=torch.long)
        prompt[:, 0] = BOS
        gold = subj.clone()
        for k, chain in enumerate(self.qtype_chains):
            rows = (q == k).nonzero()[:, 0]
            for h, r in enumerate(chain):
                prompt[rows, 1 + h] = self.rel_base + r
                gold[rows] = kb[rows, r, gold[rows]]
        prompt[:, -1] = self.ent_base + subj
        if answer is not None:
            gold = answer
        return {"prompt": prompt, "kb": kb, "qtype": q, "gold": gold, "subject": subj}

    # ------------------------------------------------------------------ the tool
    def search(self, kb: torch.Tensor, ent: torch.Tensor, rel: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Facts [B, n_facts, 3] (subject, relation, object as entity / relation indices) for queries
        (ent, rel) (indices, assumed valid). Slot 1 holds the true fact with probability ``p_true`` (when
        the relation applies to the entity); every other slot is a distractor with the same relation and
        another subject."""
        B = len(ent)
        cand = self.subj_cands[rel]  # [B, Cmax]
        valid = (cand >= 0) & (cand != ent[:, None])
        u = torch.rand(cand.shape, generator=gen).masked_fill(~valid, 2.0)
        pick = u.argsort(1)[:, : self.n_facts]  # distinct distractor subjects
        ds = cand.gather(1, pick)  # [B, k]
        do = kb[torch.arange(B)[:, None], rel[:, None], ds]
        true_o = kb[torch.arange(B), rel, ent]
        use_true = (true_o >= 0) & (torch.rand(B, generator=gen) < self.p_true)
        subj = torch.where(use_true[:, None] & (torch.arange(self.n_facts) == 0), ent[:, None], ds)
        obj = torch.where(use_true[:, None] & (torch.arange(self.n_facts) == 0), true_o[:, None], do)
        return torch.stack([subj, rel[:, None].expand(-1, self.n_facts), obj], -1)

    def info_tokens(self, facts: torch.Tensor) -> torch.Tensor:
        """[B, n_facts, 3] → the info block [B, info_len]."""
        B = facts.shape[0]
        tok = torch.stack(
            [facts[..., 0] + self.obs_base, facts[..., 1] + self.rel_base, facts[..., 2] + self.obs_base], -1
        ).reshape(B, -1)
        return torch.cat([torch.full((B, 1), INFO), tok, torch.full((B, 1), END_INFO)], 1)


# ------------------------------------------------------------------ the built-in env
def builtin_env(
    n_persons: int, n_cities: int, n_countries: int, n_orgs: int, p_true: float, n_facts: int, ood_obs: bool
) -> Env:
    counts = {"person": n_persons, "city": n_cities, "country": n_countries, "org": n_orgs}
    prefix = {"person": "P", "city": "C", "country": "N", "org": "O"}
    names, types = [], []
    for ti, t in enumerate(TYPES):
        names += [f"{prefix[t]}{i}" for i in range(counts[t])]
        types += [ti] * counts[t]
    rels = [r for r, _, _ in RELATIONS]
    return Env(
        ent_names=names,
        ent_type=torch.tensor(types),
        types=TYPES,
        rel_names=rels,
        rel_dom=[TYPES.index(d) for _, d, _ in RELATIONS],
        rel_rng=[TYPES.index(g) for _, _, g in RELATIONS],
        qtype_names=list(QTYPES),
        qtype_chains=[tuple(rels.index(r) for r in c) for c in QTYPES.values()],
        p_true=p_true,
        n_facts=n_facts,
        ood_obs=ood_obs,
    )


# ------------------------------------------------------------------ trajectories
@dataclass
class Batch:
    """A batch of trajectories: ids [B, L]; ``mask`` marks model-generated (action) tokens, the only ones
    trained or regularised; ``ans_mask`` the tokens of answer actions; reward 0/1 (exact match)."""

    ids: torch.Tensor
    mask: torch.Tensor
    ans_mask: torch.Tensor
    reward: torch.Tensor
    n_search: torch.Tensor
    answered: torch.Tensor
    qtype: torch.Tensor
    logp: torch.Tensor | None = None  # [B, L−1] log π(ids[:, t+1]) under the sampling policy (at T = 1)

    def select(self, idx: torch.Tensor) -> Batch:
        return Batch(*(None if getattr(self, f) is None else getattr(self, f)[idx] for f in self.__dataclass_fields__))


def gold_trajectories(env: Env, ep: dict[str, torch.Tensor], gen: torch.Generator, corrupt: float) -> Batch:
    """The trajectories of the Bayes-optimal tool user (search each hop, copy slot 1's object, answer it),
    with the answer replaced by a random entity of the right type with probability ``corrupt`` (the weak
    SFT init the card asks for)."""
    n, L = len(ep["gold"]), env.seq_len
    ids = torch.full((n, L), PAD, dtype=torch.long)
    mask = torch.zeros(n, L, dtype=torch.bool)
    ans = torch.zeros(n, L, dtype=torch.bool)
    ids[:, : env.prompt_len] = ep["prompt"]
    cur = ep["subject"].clone()
    hops = torch.tensor([len(c) for c in env.qtype_chains])[ep["qtype"]]
    chains = torch.tensor([list(c) + [0] * (env.max_hops - len(c)) for c in env.qtype_chains])[ep["qtype"]]
    last_rel = chains.gather(1, (hops - 1)[:, None])[:, 0]
    pos = env.prompt_len
    for h in range(env.max_turns):
        search = hops > h
        rows = search.nonzero()[:, 0]
        a = ids[:, pos : pos + ACTION_LEN]
        if len(rows):
            rel = chains[rows, h]
            a[rows] = torch.stack(
                [
                    torch.full_like(rel, SEARCH),
                    cur[rows] + env.ent_base,
                    rel + env.rel_base,
                    torch.full_like(rel, END_SEARCH),
                ],
                1,
            )
        fin = (hops == h).nonzero()[:, 0]
        if len(fin):
            answer = cur[fin].clone()
            flip = torch.rand(len(fin), generator=gen) < corrupt
            rng_t = torch.tensor(env.rel_rng)[last_rel[fin]]
            for t in rng_t.unique().tolist():
                sel = flip & (rng_t == t)
                ents = (env.ent_type == t).nonzero()[:, 0]
                answer[sel] = ents[torch.randint(len(ents), (int(sel.sum()),), generator=gen)]
            a[fin] = torch.stack(
                [
                    torch.full_like(answer, ANSWER),
                    answer + env.ent_base,
                    torch.full_like(answer, END_ANSWER),
                    torch.full_like(answer, EOS),
                ],
                1,
            )
            ans[fin, pos : pos + ACTION_LEN] = True
        mask[hops >= h, pos : pos + ACTION_LEN] = True
        pos += ACTION_LEN
        if h < env.max_turns - 1:
            if len(rows):
                facts = env.search(ep["kb"][rows], cur[rows], chains[rows, h], gen)
                ids[rows, pos : pos + env.info_len] = env.info_tokens(facts)
                cur[rows] = facts[:, 0, 2]
            pos += env.info_len
    reward = (ids.gather(1, ans.float().argmax(1, keepdim=True) + 1)[:, 0] - env.ent_base == ep["gold"]).float()
    return Batch(ids, mask, ans, reward, hops.clone(), torch.ones(n, dtype=torch.bool), ep["qtype"])


@torch.no_grad()
def rollout(model, env: Env, ep: dict[str, torch.Tensor], gen: torch.Generator, temperature: float = 1.0) -> Batch:
    """Lock-step batched rollouts of ``model`` (a TinyTransformer) with the KV cache: sample an action
    token by token, run the tool, feed the info block as one chunk. An invalid action (or a search on the
    last turn) ends the episode with reward 0. ``temperature == 0``: greedy."""
    from pipelines.core.api import KVCache

    prompt, kb, gold = ep["prompt"], ep["kb"], ep["gold"]
    B, L = len(prompt), env.seq_len
    ids = torch.full((B, L), PAD, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.bool)
    ans = torch.zeros(B, L, dtype=torch.bool)
    ids[:, : env.prompt_len] = prompt
    alive = torch.ones(B, dtype=torch.bool)
    reward = torch.zeros(B)
    n_search = torch.zeros(B, dtype=torch.long)
    answered = torch.zeros(B, dtype=torch.bool)
    logp = torch.zeros(B, L - 1)
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device  # the env stays on the CPU; only the model's calls move
    cache = KVCache()
    logits = model(prompt.to(dev), cache=cache)[:, -1].float().cpu()
    pos = env.prompt_len
    for turn in range(env.max_turns):
        for _ in range(ACTION_LEN):
            if temperature == 0:
                tok = logits.argmax(-1)
            else:
                tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=gen)[:, 0]
            tok = torch.where(alive, tok, torch.full_like(tok, PAD))
            logp[:, pos - 1] = torch.log_softmax(logits.float(), -1).gather(1, tok[:, None])[:, 0] * alive
            ids[:, pos] = tok
            mask[:, pos] = alive
            logits = model(tok[:, None].to(dev), cache=cache)[:, -1].float().cpu()
            pos += 1
        a = ids[:, pos - ACTION_LEN : pos]
        is_answer = (
            alive & (a[:, 0] == ANSWER) & env.is_entity_token(a[:, 1]) & (a[:, 2] == END_ANSWER) & (a[:, 3] == EOS)
        )
        is_search = (
            alive
            & (a[:, 0] == SEARCH)
            & env.is_entity_token(a[:, 1])
            & env.is_relation_token(a[:, 2])
            & (a[:, 3] == END_SEARCH)
            & (turn < env.max_turns - 1)
        )
        ans[is_answer, pos - ACTION_LEN : pos] = True
        reward = torch.where(is_answer, (a[:, 1] - env.ent_base == gold).float(), reward)
        answered |= is_answer
        n_search += is_search.long()
        alive = is_search
        if turn == env.max_turns - 1 or not bool(alive.any()):
            break
        info = torch.full((B, env.info_len), PAD, dtype=torch.long)
        rows = alive.nonzero()[:, 0]
        facts = env.search(kb[rows], a[rows, 1] - env.ent_base, a[rows, 2] - env.rel_base, gen)
        info[rows] = env.info_tokens(facts)
        ids[:, pos : pos + env.info_len] = info
        logits = model(info.to(dev), cache=cache)[:, -1].float().cpu()
        pos += env.info_len
    model.train(was_training)
    return Batch(ids, mask, ans, reward, n_search, answered, ep["qtype"], logp)
