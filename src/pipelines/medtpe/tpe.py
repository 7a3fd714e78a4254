"""The layered tokeniser of MedTPE (method section "Vocabulary construction" and "Tokenisation"):
a byte-level BPE trained here (pure Python, no `tokenizers` dependency), then a second, token-level pass
of n-gram merges chosen on the task corpus, with dependency-aware replacement of old token IDs so the
vocabulary size does not change. Everything is lossless: decode(encode(x)) == x."""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable, Sequence

# Pre-tokenisation in the GPT-2 manner: optional leading space + letters / digits / other symbols, or a
# whitespace run. Every character falls in exactly one class, so the pieces concatenate back to the text.
PRETOKEN = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
SPECIALS = ("<pad>", "<eos>")


def _byte_alphabet() -> list[str]:
    """One printable character per byte: printable latin-1 bytes stand for themselves, the others
    (space, control bytes...) are shifted past 255, so ' ' reads 'Ġ' and '\\n' reads 'Ċ'."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, shift = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + shift))
            shift += 1
    return out


BYTE_CHARS = _byte_alphabet()
CHAR_BYTE = {c: i for i, c in enumerate(BYTE_CHARS)}


def pretokenize(text: str) -> list[str]:
    """Text → byte-mapped pieces (each a string over BYTE_CHARS)."""
    return ["".join(BYTE_CHARS[b] for b in m.encode("utf-8")) for m in PRETOKEN.findall(text)]


def unmap(s: str) -> str:
    return bytes(CHAR_BYTE[c] for c in s).decode("utf-8", errors="strict")


def has_digit(token: str) -> bool:
    return any(c.isdigit() for c in token)


# ------------------------------------------------------------------------------------------------ BPE
def _pairs(word: Sequence[str]) -> Counter:
    return Counter(zip(word, word[1:]))


def train_bpe(texts: Iterable[str], vocab_size: int, min_pair_freq: int = 2) -> list[tuple[str, str]]:
    """Byte-level BPE merges, most frequent pair first (ties: the lexicographically smallest pair).

    Incremental counts: after a merge only the words that held the pair are re-counted; a lazy max-heap
    holds (−count, pair) and stale entries are skipped when popped."""
    words = Counter(piece for t in texts for piece in pretokenize(t))
    seqs = [list(w) for w in words]
    freq = list(words.values())
    counts: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, s in enumerate(seqs):
        for pr, c in _pairs(s).items():
            counts[pr] += c * freq[i]
            where.setdefault(pr, set()).add(i)
    heap = [(-c, pr) for pr, c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    n_target = vocab_size - len(SPECIALS) - 256
    while len(merges) < n_target and heap:
        negc, pr = heapq.heappop(heap)
        if counts.get(pr, 0) != -negc:
            continue  # stale entry
        if -negc < min_pair_freq:
            break
        merges.append(pr)
        a, b = pr
        new = a + b
        changed: set[tuple[str, str]] = set()
        for i in list(where.get(pr, ())):
            s = seqs[i]
            old = _pairs(s)
            j, out = 0, []
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            cur = _pairs(out)
            for q in old.keys() | cur.keys():
                d = (cur.get(q, 0) - old.get(q, 0)) * freq[i]
                if d:
                    counts[q] += d
                    changed.add(q)
                if q in cur:
                    where.setdefault(q, set()).add(i)
                elif q in where:
                    where[q].discard(i)
        for q in changed:
            if counts[q] > 0:
                heapq.heappush(heap, (-counts[q], q))
            else:
                counts.pop(q, None)
    return merges


def bpe_word(piece: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply merges to one pre-token: repeatedly merge every occurrence of the lowest-rank adjacent pair."""
    s = list(piece)
    while len(s) > 1:
        best = min(zip(s, s[1:]), key=lambda q: ranks.get(q, 1 << 30))
        if best not in ranks:
            break
        a, b = best
        out, j = [], 0
        while j < len(s):
            if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                out.append(a + b)
                j += 2
            else:
                out.append(s[j])
                j += 1
        s = out
    return s


class BPE:
    """A byte-level BPE tokeniser: ``vocab`` (id → token string) = specials, the 256 byte characters,
    then one token per merge. ``strings(text)`` gives token strings, ``encode`` ids, ``decode`` text."""

    def __init__(self, merges: Sequence[Sequence[str]], vocab: Sequence[str] | None = None):
        self.merges = [tuple(m) for m in merges]
        self.vocab = list(vocab) if vocab is not None else [*SPECIALS, *BYTE_CHARS, *(a + b for a, b in self.merges)]
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.stoi = {s: i for i, s in enumerate(self.vocab) if s is not None}
        self.parts = {a + b: (a, b) for a, b in self.merges}  # the merge that produces each token
        self._cache: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        return self.stoi["<pad>"]

    def word(self, piece: str) -> list[str]:
        out = self._cache.get(piece)
        if out is None:
            out = self._cache[piece] = bpe_word(piece, self.ranks)
        return out

    def strings(self, text: str) -> list[str]:
        return [t for piece in pretokenize(text) for t in self.word(piece)]

    def encode(self, text: str) -> list[int]:
        return [self.stoi[t] for t in self.strings(text)]

    def decode(self, ids: Iterable[int]) -> str:
        return unmap("".join(self.vocab[int(i)] for i in ids if self.vocab[int(i)] not in SPECIALS))

    def decompose(self, token: str) -> set[str]:
        """The token and every token on its merge path (recursively through the merge table)."""
        out, stack = set(), [token]
        while stack:
            t = stack.pop()
            if t in out:
                continue
            out.add(t)
            if t in self.parts:
                stack.extend(self.parts[t])
        return out

    def to_dict(self) -> dict:
        return {"merges": [list(m) for m in self.merges], "vocab": self.vocab}

    @classmethod
    def from_dict(cls, d: dict) -> BPE:
        return cls(d["merges"], d.get("vocab"))


# ------------------------------------------------------------------------------------------------ TPE
class TPE:
    """Layered tokeniser: a (possibly reduced) BPE, then a left-to-right trie pass over the token list
    that replaces n-grams of tokens by composite tokens.

    ``merges``: n-grams (tuples of base token strings) in priority order (index 0 = best score); at each
    position the matched n-gram with the best priority wins, not the longest. ``removed``: old tokens
    whose IDs were handed to composites (replace mode); their BPE merges, and merges using them, are gone.
    ``vocab``: id → token string of the layered tokeniser (composites are the concatenated strings, so
    decoding needs nothing special)."""

    def __init__(
        self,
        base: BPE,
        merges: Sequence[Sequence[str]],
        removed: Sequence[str],
        vocab: Sequence[str],
        mode: str = "replace",
    ):
        self.base_full, self.mode = base, mode
        self.merges = [tuple(m) for m in merges]
        self.removed = list(removed)
        gone = set(self.removed)
        kept = [m for m in base.merges if m[0] not in gone and m[1] not in gone and m[0] + m[1] not in gone]
        self.base = BPE(kept, base.vocab)  # ranks of the surviving merges keep their order
        self.vocab = list(vocab)
        self.stoi = {s: i for i, s in enumerate(self.vocab)}
        self.composite = {"".join(m): m for m in self.merges}
        self.trie: dict = {}
        for prio, m in enumerate(self.merges):
            node = self.trie
            for t in m:
                node = node.setdefault(t, {})
            node[None] = min(prio, node.get(None, prio))

    def __len__(self) -> int:
        return len(self.vocab)

    def merge_pass(self, toks: Sequence[str]) -> list[str]:
        out, i, n = [], 0, len(toks)
        while i < n:
            node, best, j = self.trie, None, i
            while j < n and toks[j] in node:
                node = node[toks[j]]
                j += 1
                if None in node and (best is None or node[None] < best[0]):
                    best = (node[None], j)
            if best is None:
                out.append(toks[i])
                i += 1
            else:
                out.append("".join(toks[i : best[1]]))
                i = best[1]
        return out

    def strings(self, text: str) -> list[str]:
        return self.merge_pass(self.base.strings(text))

    def encode(self, text: str) -> list[int]:
        return [self.stoi[t] for t in self.strings(text)]

    def decode(self, ids: Iterable[int]) -> str:
        return unmap("".join(self.vocab[int(i)] for i in ids if self.vocab[int(i)] not in SPECIALS))

    def new_ids(self) -> list[int]:
        return [self.stoi["".join(m)] for m in self.merges]

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "merges": [list(m) for m in self.merges],
            "removed": self.removed,
            "vocab": self.vocab,
        }

    @classmethod
    def from_dict(cls, base: BPE, d: dict) -> TPE:
        return cls(base, d["merges"], d["removed"], d["vocab"], d["mode"])


def mine_ngrams(corpus: Iterable[Sequence[str]], max_n: int, skip: Iterable[str] = ()) -> Counter:
    """Contiguous token n-grams (n = 2..max_n) and their frequencies; n-grams touching a token in
    ``skip`` (digit-bearing tokens, specials) are not counted."""
    bad = set(skip)
    F: Counter = Counter()
    for toks in corpus:
        for n in range(2, max_n + 1):
            for i in range(len(toks) - n + 1):
                g = tuple(toks[i : i + n])
                if not bad.intersection(g):
                    F[g] += 1
    return F


def build_tpe(
    base: BPE,
    texts: Sequence[str],
    *,
    max_n: int = 2,
    max_m: int = 200,
    min_freq: int = 2,
    number_filter: str = "ngram",
    mode: str = "replace",
    protect: Iterable[str] = (),
) -> TPE:
    """Choose the composite tokens on the task corpus ``texts`` and give them IDs.

    Score S(g) = F(g)·len(g); the best n-gram is taken first; after choosing g, every longer candidate
    with g as a proper prefix loses F·len(g). Replace mode takes the ID of the least needed old token
    that is not protected (specials, single bytes, and every token on the merge path of ``protect`` and of
    any sub-token of any candidate: the dependency-aware rule, so the sub-tokens are still produced).
    "Needed" counts the corpus tokens built through the token (itself or its merge path), so a token is
    never replaced before a word that is built through it, and a word gets longer only if one of its own
    tokens was replaced.
    ``number_filter``: ``ngram`` skips n-grams containing a digit-bearing token; ``text`` deletes digit
    runs from the text before mining (the public code's behaviour); ``none``."""
    if mode not in ("replace", "extend"):
        raise ValueError(f"mode must be 'replace' or 'extend', got {mode!r}")
    if number_filter not in ("ngram", "text", "none"):
        raise ValueError(f"number_filter must be 'ngram', 'text' or 'none', got {number_filter!r}")
    mine_texts = [re.sub(r"\d+", "", t) for t in texts] if number_filter == "text" else list(texts)
    corpus = [base.strings(t) for t in mine_texts]
    skip = set(SPECIALS)
    if number_filter == "ngram":
        skip |= {t for t in base.vocab if t is not None and has_digit(unmap_safe(t))}
    F = mine_ngrams(corpus, max_n, skip)
    vocab_set = set(base.vocab)
    cand = {g: f for g, f in F.items() if f >= min_freq and "".join(g) not in vocab_set}
    S = {g: f * len(g) for g, f in cand.items()}

    protected = set(SPECIALS) | set(BYTE_CHARS)
    for t in {*protect, *(t for g in cand for t in g)}:
        if t not in protected:
            protected |= base.decompose(t)
    # How many corpus tokens are built through each old token (the token itself or any step of its merge
    # path): removing a token removes every merge that uses it, so a token a frequent word is built through
    # ('Ad' for 'Admission') is as needed as that word although it never ends a word itself. A token's parts
    # are needed at least as often and have lower IDs, so they always go after it.
    unigram = Counter(t for toks in corpus for t in toks)
    needed: Counter = Counter()
    for u, c in unigram.items():
        for t in base.decompose(u):
            needed[t] += c
    vocab = list(base.vocab)
    free = [(needed.get(t, 0), -i, t) for i, t in enumerate(base.vocab) if t not in protected]
    heapq.heapify(free)
    by_prefix: dict[tuple, list[tuple]] = {}
    for g in cand:
        for k in range(2, len(g)):
            by_prefix.setdefault(g[:k], []).append(g)
    heap = [(-s, g) for g, s in S.items()]
    heapq.heapify(heap)
    chosen: list[tuple[str, ...]] = []
    removed: list[str] = []
    gone: set[str] = set()
    taken = set(vocab_set)
    while heap and len(chosen) < max_m:
        negs, g = heapq.heappop(heap)
        if S[g] != -negs:
            continue  # stale after a prefix discount
        new = "".join(g)
        if new in taken or gone.intersection(g):
            continue
        if mode == "replace":
            if not free:
                break
            _, neg_id, old = heapq.heappop(free)
            vocab[-neg_id] = new
            removed.append(old)
            gone.add(old)
        else:
            vocab.append(new)
        taken.add(new)
        chosen.append(g)
        for longer in by_prefix.get(g, ()):
            S[longer] -= cand[longer] * len(g)
            heapq.heappush(heap, (-S[longer], longer))
    return TPE(base, chosen, removed, vocab, mode)


def unmap_safe(t: str) -> str:
    try:
        return unmap(t)
    except (UnicodeDecodeError, KeyError):
        return t
