"""Green-list watermarks and their z-score detectors (Zhao et al.'s Unigram; Kirchenbauer et al.'s KGW with
the "time" seeding scheme: the green list of a position is seeded by key × the product of the previous h
token ids), z = (|green| − γT) / √(Tγ(1 − γ)). Generation adds δ to the green logits."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

_MOD = (1 << 61) - 1


class Watermark:
    """``scheme`` "unigram" (one fixed green list) or "kgw" (a list per h-token context). Green lists are
    ``round(γ · n)`` of the n text tokens (specials are never scored nor green)."""

    def __init__(
        self,
        scheme: str,
        vocab_size: int,
        text_ids: Sequence[int],
        gamma: float,
        delta: float,
        key: int,
        context: int = 1,
    ):
        if scheme not in ("unigram", "kgw"):
            raise ValueError(f"watermark scheme must be 'unigram' or 'kgw', got {scheme!r}")
        self.scheme, self.V, self.gamma, self.delta, self.key = scheme, vocab_size, gamma, delta, key
        self.h = context if scheme == "kgw" else 0
        self.text_ids = np.asarray(sorted(text_ids), dtype=np.int64)
        self.is_text = np.zeros(vocab_size, dtype=bool)
        self.is_text[self.text_ids] = True
        self.n_green = int(round(gamma * len(self.text_ids)))
        self._cache: dict[int, np.ndarray] = {}
        self._fixed = self._green_from_seed(key) if scheme == "unigram" else None

    def _green_from_seed(self, seed: int) -> np.ndarray:
        g = self._cache.get(seed)
        if g is None:
            perm = np.random.default_rng([seed % _MOD, self.key]).permutation(self.text_ids)
            g = np.zeros(self.V, dtype=bool)
            g[perm[: self.n_green]] = True
            self._cache[seed] = g
        return g

    def seed_of(self, ctx: Sequence[int]) -> int:
        prod = 1
        for t in ctx:
            prod = (prod * int(t)) % _MOD
        return (self.key * prod) % _MOD

    def green(self, ctx: Sequence[int] = ()) -> np.ndarray | None:
        """Bool [V] green list after the text tokens ``ctx``; None when KGW has fewer than h of them."""
        if self._fixed is not None:
            return self._fixed
        if len(ctx) < self.h:
            return None
        return self._green_from_seed(self.seed_of(ctx[-self.h :]))

    def bias(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """δ on the green logits of each row [B, V] (rows without enough context: no bias)."""
        out = np.zeros((len(contexts), self.V), dtype=np.float32)
        for i, ctx in enumerate(contexts):
            g = self.green(ctx)
            if g is not None:
                out[i, g] = self.delta
        return torch.from_numpy(out)

    def count(self, ids: Sequence[int]) -> tuple[int, int]:
        """(green, scored) over the text tokens of ``ids`` (KGW scores from the (h+1)-th text token on)."""
        toks = [int(t) for t in ids if 0 <= int(t) < self.V and self.is_text[int(t)]]
        if self._fixed is not None:
            return int(self._fixed[toks].sum()) if toks else 0, len(toks)
        green = sum(bool(self.green(toks[i - self.h : i])[toks[i]]) for i in range(self.h, len(toks)))
        return green, max(0, len(toks) - self.h)

    def z(self, ids: Sequence[int]) -> float:
        g, n = self.count(ids)
        return z_score(g, n, self.gamma)


def z_score(green: int, scored: int, gamma: float) -> float:
    if scored == 0:
        return 0.0
    return (green - gamma * scored) / math.sqrt(scored * gamma * (1 - gamma))


def expected_z(p_green: float, scored: int, gamma: float) -> float:
    """E[z] when each scored token is green with probability ``p_green``: (p − γ)·√T / √(γ(1 − γ))."""
    return (p_green - gamma) * math.sqrt(scored) / math.sqrt(gamma * (1 - gamma))
