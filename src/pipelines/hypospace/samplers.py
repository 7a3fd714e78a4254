"""Samplers over a hypothesis space given one observation set (paper §4 protocol): each proposes N
hypotheses, one per query, as canonical keys (None: an answer that did not parse).

Offline samplers (no LLM) are distributions over hypotheses:
- ``uniform_valid``: i.i.d. uniform over A (the reference; E[R] = 1 − (1 − 1/|A|)^N).
- ``uniform_prior``: i.i.d. uniform over the whole space H (E[V] = |A|/|H|).
- ``mode_collapse``: softmax(−score/T) over A, score = complexity + η_h, where η_h ~ N(0, eta_scale²) is a
  fixed, seeded preference per hypothesis (a low-temperature LLM's idiosyncratic favourites).
- ``history_avoid``: ``mode_collapse``, but a proposal among the last ``history_window`` unique ones is
  redrawn with probability p_obey (up to ``max_redraws`` times): a simulated "do not repeat".
- ``stratified``: strata of a structural statistic visited round-robin, ``mode_collapse`` inside each.
- ``noisy``: a ``mode_collapse`` proposal corrupted with probability q (the domain's one-step corruption).
- ``enumerate``: A in key order, cycled (the upper bound R = min(1, N/|A|)).

``llm`` (and ``llm_stratified``, which also names the stratum each query must hit) asks an OpenAI-compatible endpoint through ``pipelines.core.llm.ChatClient`` with the domain's
prompt (observations, rules, the last prior unique proposals) and parses the answer, re-asking up to
``retries`` times when it does not parse.
"""

from __future__ import annotations

import zlib

import numpy as np

from pipelines.hypospace.params import Llm, Samplers

SYSTEM = (
    "You generate hypotheses for underdetermined scientific problems. Every answer must follow the "
    "requested output format exactly."
)

_M64 = (1 << 64) - 1


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_M64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def preference(keys: list[str], seed: int, scale: float) -> np.ndarray:
    """η_h: a standard normal per (seed, hypothesis key), times ``scale`` (Box–Muller on a hash), so the
    same hypothesis has the same preference in every observation set of a seed."""
    if scale == 0 or not keys:
        return np.zeros(len(keys))
    h = np.array([zlib.crc32(k.encode()) for k in keys], dtype=np.uint64)
    with np.errstate(over="ignore"):
        a = _splitmix(h ^ (np.uint64(seed & 0xFFFFFFFF) << np.uint64(32)))
        b = _splitmix(a)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = (b >> np.uint64(11)).astype(np.float64) / 2.0**53
    return scale * np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)


def softmax_weights(score: np.ndarray, T: float) -> np.ndarray:
    z = -(score - score.min()) / T
    w = np.exp(z)
    return w / w.sum()


def offline_proposals(
    variant: str,
    dom,
    keys: list[str],
    complexity: np.ndarray,
    stratum: np.ndarray,
    n_queries: int,
    rng: np.random.Generator,
    eta: np.ndarray,
    sp: Samplers,
    window: int,
) -> list[str | None]:
    """N proposals (keys) of an offline sampler for one observation set with admissible ``keys``."""
    K = len(keys)
    if variant == "uniform_valid":
        return [keys[i] for i in rng.integers(K, size=n_queries)]
    if variant == "uniform_prior":
        return dom.sample_prior(rng, n_queries)
    if variant == "enumerate":
        return [keys[q % K] for q in range(n_queries)]
    score = complexity + eta
    if variant == "stratified":
        levels = np.unique(stratum)
        members = [np.flatnonzero(stratum == s) for s in levels]
        weights = [softmax_weights(score[m], sp.temperature) for m in members]
        out = []
        for q in range(n_queries):
            j = q % len(levels)
            out.append(keys[members[j][rng.choice(len(members[j]), p=weights[j])]])
        return out
    w = softmax_weights(score, sp.temperature)
    if variant == "mode_collapse":
        return [keys[i] for i in rng.choice(K, size=n_queries, p=w)]
    if variant == "noisy":
        out = []
        for i in rng.choice(K, size=n_queries, p=w):
            k = keys[i]
            if rng.random() < sp.noise_q:
                k = dom.key(dom.perturb(dom.from_key(k), rng))
            out.append(k)
        return out
    if variant == "history_avoid":
        out, history, seen = [], [], set()
        for _ in range(n_queries):
            i = rng.choice(K, p=w)
            tries = 0
            while window and keys[i] in history[-window:] and tries < sp.max_redraws and rng.random() < sp.p_obey:
                i = rng.choice(K, p=w)
                tries += 1
            out.append(keys[i])
            if keys[i] not in seen:
                seen.add(keys[i])
                history.append(keys[i])
        return out
    raise ValueError(f"unknown offline sampler {variant!r}")


def llm_client(lp: Llm):
    """The platform's chat client for this run's endpoint; the key comes from the environment variable
    named by ``llm.api_key_env`` (never from a parameters file)."""
    import os

    from pipelines.core.api import ChatClient

    key = os.environ.get(lp.api_key_env) if lp.api_key_env else None
    return ChatClient(
        lp.base_url,
        lp.model,
        api_key=key,
        timeout_s=lp.timeout_s,
        cache_path=lp.cache_path,
        param_prefix="hypospace.llm",
    )


def llm_proposals(
    dom,
    obs: dict,
    n_queries: int,
    client,
    lp: Llm,
    window: int,
    seed: int,
    obs_id: str,
    strata: list[int] | None = None,
) -> list[tuple[str, object | None, int]]:
    """(answer text, parsed hypothesis object or None, attempts) for each of N queries. Each query shows
    the last ``window`` unique parsed proposals; a request carries a seed derived from (seed, set,
    query, attempt), so repeated queries are distinct requests and a rerun replays from the cache.
    With ``strata`` (``llm_stratified``), query q asks for stratum ``strata[q % len(strata)]`` (edge count,
    total blocks or depth): stratified decoding by instruction."""
    out, history = [], []
    for q in range(n_queries):
        prior = history[-window:] if window else []
        prompt = dom.prompt(obs, prior)
        if strata:
            prompt += "\n" + dom.stratum_hint(int(strata[q % len(strata)]))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        text, obj, attempt = "", None, 0
        for attempt in range(lp.retries + 1):
            req_seed = zlib.crc32(f"{seed}/{obs_id}/{q}/{attempt}".encode())
            text = client.texts(messages, temperature=lp.temperature, max_tokens=lp.max_tokens, seed=req_seed)[0]
            try:
                obj = dom.parse_text(text)
            except (ValueError, IndexError):
                obj = None
            if obj is not None:
                break
        out.append((text, obj, attempt + 1))
        if obj is not None:
            k = dom.key(obj)
            if k not in history:
                history.append(k)
    return out
