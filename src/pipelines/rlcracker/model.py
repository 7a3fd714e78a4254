"""The language (vocabulary, meaning classes, human synonym preference), the tiny LMs (generator and attacker,
core's TinyTransformer), batched sampling with an optional watermark, completion log-probabilities, the
semantic similarity that replaces P-SP (1 − normalised edit distance of concept sequences) and the
non-adaptive attacks (human-like paraphrase, random synonym substitution)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from pipelines.core.api import KVCache, TinyConfig, TinyTransformer, Tokenizer

Q, P, A = "[Q]", "[P]", "[A]"


class Language:
    """Vocabulary built from the lexicon and the corpus; ``concept_of[id]`` (−1 for specials), the synonyms of
    each concept and their human preference (the lexicon's ``pref`` column, else corpus frequencies)."""

    def __init__(self, lexicon: pd.DataFrame, corpus: pd.DataFrame):
        words = list(dict.fromkeys(lexicon["token"].tolist()))
        seen = set(words)
        extra = sorted({w for col in ("question", "answer") for t in corpus[col] for w in t.split()} - seen)
        self.tok = Tokenizer(words + extra, level="word", extra_specials=(Q, P, A))
        self.V = len(self.tok)
        self.q_id, self.p_id, self.a_id = (self.tok.stoi[s] for s in (Q, P, A))
        self.eos_id, self.pad_id = self.tok.eos_id, self.tok.pad_id
        n_special = len(Tokenizer.SPECIALS) + 3
        self.text_ids = np.arange(n_special, self.V)
        self._text_set = set(self.text_ids.tolist())
        names = {w: c for w, c in zip(lexicon["token"], lexicon["concept"])}
        concepts = list(dict.fromkeys([names.get(w, f"__{w}") for w in self.tok.itos[n_special:]]))
        cidx = {c: i for i, c in enumerate(concepts)}
        self.concept_of = np.full(self.V, -1, dtype=np.int64)
        for i in self.text_ids:
            w = self.tok.itos[i]
            self.concept_of[i] = cidx[names.get(w, f"__{w}")]
        if "pref" in lexicon.columns:
            pref = dict(zip(lexicon["token"], lexicon["pref"].astype(float)))
            weight = np.array([pref.get(self.tok.itos[i], 1.0) for i in range(self.V)])
        else:
            counts = pd.Series([w for t in corpus["answer"] for w in t.split()]).value_counts()
            weight = np.array([counts.get(self.tok.itos[i], 0) + 1.0 for i in range(self.V)])
        self.synonyms: list[np.ndarray] = [
            self.text_ids[self.concept_of[self.text_ids] == c] for c in range(len(concepts))
        ]
        self.syn_p = [weight[s] / weight[s].sum() for s in self.synonyms]
        self.allowed_text = torch.zeros(self.V, dtype=torch.bool)
        self.allowed_text[torch.from_numpy(self.text_ids)] = True
        self.allowed_rewrite = self.allowed_text.clone()
        self.allowed_rewrite[self.eos_id] = True

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def text(self, ids: Sequence[int]) -> str:
        return " ".join(self.tok.itos[int(i)] for i in ids if int(i) in self._text_set)

    def surface(self, ids: Sequence[int]) -> list[int]:
        return [int(i) for i in ids if int(i) in self._text_set]

    def concepts(self, ids: Sequence[int]) -> np.ndarray:
        return self.concept_of[np.asarray(self.surface(ids), dtype=np.int64)]

    # -------------------------------------------------------------------- non-adaptive rewrites
    def paraphrase(self, ids: Sequence[int], copy_prob: float, rng: np.random.Generator) -> list[int]:
        """Keep every concept; reuse the source synonym with prob ``copy_prob``, else draw the human choice."""
        out = []
        for t in ids:
            c = self.concept_of[int(t)]
            if c < 0 or rng.random() < copy_prob:
                out.append(int(t))
            else:
                out.append(int(rng.choice(self.synonyms[c], p=self.syn_p[c])))
        return out

    def substitute(self, ids: Sequence[int], rate: float, rng: np.random.Generator) -> list[int]:
        """Replace each token with prob ``rate`` by a different synonym drawn uniformly."""
        out = []
        for t in ids:
            c = self.concept_of[int(t)]
            if c >= 0 and len(self.synonyms[c]) > 1 and rng.random() < rate:
                others = self.synonyms[c][self.synonyms[c] != int(t)]
                out.append(int(rng.choice(others)))
            else:
                out.append(int(t))
        return out

    # -------------------------------------------------------------------- prompts
    def qa_prompt(self, question: str) -> list[int]:
        return [self.q_id, *self.ids(question), self.a_id]

    def para_prompt(self, ids: Sequence[int]) -> list[int]:
        return [self.p_id, *self.surface(ids), self.a_id]


# ------------------------------------------------------------------------ semantic similarity
def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance; each DP row in numpy (the insertion chain is a running minimum)."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) == 0 or len(b) == 0:
        return int(max(len(a), len(b)))
    j = np.arange(len(b) + 1)
    prev = j.copy()
    for i in range(1, len(a) + 1):
        cur = np.empty_like(prev)
        cur[0] = i
        cur[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (b != a[i - 1]))
        cur = np.minimum.accumulate(cur - j) + j
        prev = cur
    return int(prev[-1])


def similarity(a: Sequence[int], b: Sequence[int]) -> float:
    """1 − edit distance / max length (1 for two empty sequences)."""
    n = max(len(a), len(b))
    return 1.0 if n == 0 else 1.0 - edit_distance(a, b) / n


def semantic_reward(s: np.ndarray | float, s0: float) -> np.ndarray:
    """2σ(k(s − s0)) − 1 with k = logit(0.975)/(1 − s0): 0 at s0, 0.95 at s = 1."""
    k = np.log(0.975 / 0.025) / (1 - s0)
    return 2.0 / (1.0 + np.exp(-k * (np.asarray(s, float) - s0))) - 1.0


# ------------------------------------------------------------------------ models
def make_model(vocab_size: int, cfg) -> TinyTransformer:
    return TinyTransformer(
        TinyConfig(
            vocab_size=vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, max_len=cfg.max_len
        )
    )


def pack(model: TinyTransformer) -> dict:
    c = model.config
    return {
        "config": {
            "vocab_size": c.vocab_size,
            "d_model": c.d_model,
            "n_layers": c.n_layers,
            "n_heads": c.n_heads,
            "max_len": c.max_len,
        },
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def unpack(blob: dict, device: torch.device | str = "cpu") -> TinyTransformer:
    m = TinyTransformer(TinyConfig(**{k: int(v) for k, v in blob["config"].items()}))
    m.load_state_dict(blob["state"])
    return m.to(device).eval()


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return ids


@torch.no_grad()
def sample(
    model: TinyTransformer,
    prompts: Sequence[Sequence[int]],
    n_new: int,
    *,
    temperature: float,
    gen: torch.Generator,
    allowed: torch.Tensor,
    eos_id: int | None = None,
    watermark=None,
    histories: Sequence[Sequence[int]] | None = None,
    batch_size: int = 512,
) -> list[list[int]]:
    """Sample ``n_new`` tokens (or up to and including ``eos_id``) after each prompt, over the ``allowed``
    tokens, with the KV cache; prompts are bucketed by length. ``watermark`` adds δ to the green logits of
    the context (the row's ``histories`` text followed by what was generated so far)."""
    dev = next(model.parameters()).device
    out: list[list[int] | None] = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, pr in enumerate(prompts):
        by_len.setdefault(len(pr), []).append(i)
    neg = torch.where(allowed, 0.0, float("-inf")).to(dev)
    for _, idx_all in sorted(by_len.items()):
        for s in range(0, len(idx_all), batch_size):
            idx = idx_all[s : s + batch_size]
            x = torch.as_tensor([list(prompts[i]) for i in idx], dtype=torch.long, device=dev)
            cache = KVCache()
            logits = model(x, cache=cache)[:, -1]
            gen_rows = [[] for _ in idx]
            done = torch.zeros(len(idx), dtype=torch.bool, device=dev)
            for _ in range(n_new):
                lg = logits.float()
                if watermark is not None:
                    ctx = [list(histories[i]) + g for i, g in zip(idx, gen_rows)] if histories is not None else gen_rows
                    lg = lg + watermark.bias(ctx).to(dev)
                lg = lg / temperature + neg
                nxt = torch.multinomial(lg.softmax(-1).cpu(), 1, generator=gen)[:, 0].to(dev)
                if eos_id is not None:
                    nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                for r, (t, d) in enumerate(zip(nxt.tolist(), done.tolist())):
                    if not d:
                        gen_rows[r].append(t)
                if eos_id is not None:
                    done |= nxt == eos_id
                    if bool(done.all()):
                        break
                logits = model(nxt[:, None], cache=cache)[:, -1]
            for i, g in zip(idx, gen_rows):
                out[i] = g
    return out  # type: ignore[return-value]


def completion_logprobs(
    model: TinyTransformer, ids: torch.Tensor, temperature: float, allowed: torch.Tensor
) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) [B, T−1] at ``temperature`` over the ``allowed`` tokens (the sampling
    distribution of :func:`sample`), differentiable."""
    logits = model(ids[:, :-1]).float() / temperature
    logits = logits + torch.where(allowed, 0.0, float("-inf")).to(logits.device)
    lp = torch.log_softmax(logits, -1)
    tgt = ids[:, 1:]
    out = lp.gather(-1, tgt[..., None])[..., 0]
    return torch.where(allowed.to(tgt.device)[tgt], out, torch.zeros_like(out))  # disallowed (pad): 0, masked
