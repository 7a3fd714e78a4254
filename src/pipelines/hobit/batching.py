"""Batch construction: the sparse score graph (chunked top-M), HOBIT's non-contradiction filter, pair
weights, anchor objective F_A and its greedy maximisation (card §Mechanism), the greedy epoch
re-ordering, and the baselines' batchers (random, k-means clusters, B3-like Louvain communities,
BatchSampler-like random walk with restart) and the ANCE-lite miner. Pure numpy (torch for the top-M)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PHI = {"log": np.log1p, "linear": lambda z: z}


# ------------------------------------------------------------------------------------------- graph
@dataclass
class ScoreGraph:
    """Top-M documents of each query under the current encoder (self excluded), scores s = <q, d>/τ, and
    each edge's reverse score (query j = idx[i, k] against document i), which the contradiction filter needs
    also when i is not in j's own top-M."""

    idx: np.ndarray  # N×M int64, by decreasing score
    s: np.ndarray  # N×M float64: s[i, k] = s_ij, j = idx[i, k]
    s_pos: np.ndarray  # N: s_ii
    s_rev: np.ndarray  # N×M float64: s_rev[i, k] = s_ji, j = idx[i, k]

    @property
    def n(self) -> int:
        return len(self.idx)


def knn_graph(qe, de, tau: float, m: int, chunk: int) -> ScoreGraph:
    """Chunked matmul + ``torch.topk``: never the N×N matrix at once. ``qe``, ``de``: N×k torch tensors.
    The reverse scores are N·M extra dot products (the matmul costs N²)."""
    import torch

    n = len(qe)
    m = min(m, n - 1)
    idx = np.empty((n, m), np.int64)
    s = np.empty((n, m), np.float64)
    s_rev = np.empty((n, m), np.float64)
    with torch.no_grad():
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            sc = (qe[lo:hi] @ de.T) / tau
            sc[torch.arange(hi - lo, device=sc.device), torch.arange(lo, hi, device=sc.device)] = -torch.inf
            top = torch.topk(sc, m, dim=1)
            idx[lo:hi] = top.indices.cpu().numpy()
            s[lo:hi] = top.values.double().cpu().numpy()
            rev = torch.einsum("rmk,rk->rm", qe[top.indices], de[lo:hi]) / tau  # <q_j, d_i>/τ
            s_rev[lo:hi] = rev.double().cpu().numpy()
        s_pos = ((qe * de).sum(1) / tau).double().cpu().numpy()
    return ScoreGraph(idx, s, s_pos, s_rev)


@dataclass
class Csr:
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray | None = None

    def row(self, i: int) -> np.ndarray:
        return self.indices[self.indptr[i] : self.indptr[i + 1]]

    def row_data(self, i: int) -> np.ndarray:
        return self.data[self.indptr[i] : self.indptr[i + 1]]


def group_pairs(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ordered pairs (i, j), i ≠ j, with the same group id (known duplicates)."""
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, len(g)])
    rows, cols = [], []
    for st, sz in zip(starts[sizes > 1], sizes[sizes > 1]):
        members = order[st : st + sz]
        r, c = np.meshgrid(members, members, indexing="ij")
        keep = r != c
        rows.append(r[keep])
        cols.append(c[keep])
    if not rows:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(rows), np.concatenate(cols)


@dataclass
class HobitGraph:
    """What the greedy needs: pair weights a_ij on the top-M graph (forward, by query), the same weights
    indexed by document (reverse: for doc i, the queries c with i in their list and a_ci), and the
    symmetric contradiction lists."""

    g: ScoreGraph
    a: np.ndarray  # N×M, aligned with g.idx
    rev: Csr  # doc i → (queries c, a_ci)
    contra: Csr  # i → examples that may not share its batch


def hobit_graph(g: ScoreGraph, delta: float | None, exp_clip: float, groups: np.ndarray | None = None) -> HobitGraph:
    """a_ij = exp(clip(s_ij − s_ii)) · 1[compatible(i, j)]. (i, j) is incompatible when (``delta`` given)
    d_j is a plausible positive for q_i (s_ij ≥ s_ii − δ) or d_i for q_j (s_ji ≥ s_jj − δ, from the edge's
    reverse score, so also when i is not in j's top-M), or (``groups`` given) they share a known duplicate id.
    The score test sees the pairs of the graph only: a pair in neither top-M list has weight 0 and is not
    checked. ``delta=None`` and ``groups=None``: no filter."""
    n, m = g.idx.shape
    rows = np.repeat(np.arange(n), m)
    cols = g.idx.ravel()
    a = np.exp(np.clip(g.s - g.s_pos[:, None], -exp_clip, exp_clip))
    cr, cc = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    if delta is not None:
        direct = (g.s >= g.s_pos[:, None] - delta).ravel()
        reverse = (g.s_rev >= g.s_pos[g.idx] - delta).ravel()
        flagged = direct | reverse
        cr.append(rows[flagged])
        cc.append(cols[flagged])
    if groups is not None:
        gr, gc = group_pairs(groups)
        cr.append(gr)
        cc.append(gc)
    cr, cc = np.concatenate(cr), np.concatenate(cc)
    if len(cr):
        keys = np.unique(np.concatenate([cr * n + cc, cc * n + cr]))  # symmetric
        contra = Csr(np.searchsorted(keys // n, np.arange(n + 1)), keys % n)
        ent = rows * n + cols
        at = np.minimum(np.searchsorted(keys, ent), len(keys) - 1)
        a = np.where((keys[at] == ent).reshape(n, m), 0.0, a)
    else:
        contra = Csr(np.zeros(n + 1, np.int64), np.empty(0, np.int64))
    order = np.argsort(cols, kind="stable")
    rev = Csr(np.searchsorted(cols[order], np.arange(n + 1)), rows[order], a.ravel()[order])
    return HobitGraph(g, a, rev, contra)


# --------------------------------------------------------------------------------- the objective
def anchor_objective(W: np.ndarray, v: np.ndarray, S, phi: str = "log") -> float:
    """F_A(S) = Σ_{i∈A} φ(Σ_{j∈S} a_ij) + Σ_{j∈S} φ(Σ_{i∈A} a_ji), with W[i, j] = a_ij (anchors × ground)
    and v[j] = Σ_{i∈A} a_ji. The reference the greedy's incremental gains are tested against."""
    f = PHI[phi]
    S = list(S)
    return float(f(W[:, S].sum(1)).sum() + f(v[S]).sum()) if S else 0.0


def all_members_objective(w: np.ndarray, B, phi: str = "log") -> float:
    """The ablation F(B) = Σ_{i∈B} φ(Σ_{j∈B∖{i}} (a_ij + a_ji)/2) (not submodular)."""
    f = PHI[phi]
    B = list(B)
    if not B:
        return 0.0
    sym = (w + w.T) / 2
    sub = sym[np.ix_(B, B)]
    np.fill_diagonal(sub, 0.0)
    return float(f(sub.sum(1)).sum())


def _take_best(gain: np.ndarray, feasible: np.ndarray, chosen: list[int]) -> int | None:
    """One greedy step: the feasible column of the largest gain, appended to ``chosen`` and made infeasible;
    None (the greedy stops) when no feasible gain is positive."""
    gain[~feasible] = -np.inf
    c = int(np.argmax(gain))
    if not gain[c] > 0:
        return None
    chosen.append(c)
    feasible[c] = False
    return c


def greedy_members(
    er: np.ndarray,
    ec: np.ndarray,
    ew: np.ndarray,
    v: np.ndarray,
    n_rows: int,
    budget: int,
    phi: str = "log",
    conflicts=None,
) -> tuple[list[int], float]:
    """Greedy max of F_A under |S| ≤ budget on a sparse W (entries (row er, column ec, weight ew), each
    (row, column) at most once) and the modular term's arguments ``v`` (one per column). ``conflicts(c)``
    gives the columns that become infeasible once column c is chosen (the pairwise non-contradiction
    filter among members). Stops early when no feasible column has a positive gain.
    Returns (chosen columns in order, F_A of them)."""
    f = PHI[phi]
    P = len(v)
    S = np.zeros(n_rows)
    base = f(v)
    feasible = np.ones(P, bool)
    chosen: list[int] = []
    for _ in range(min(budget, P)):
        contrib = f(S[er] + ew) - f(S[er])
        gain = np.bincount(ec, contrib, minlength=P) + base
        c = _take_best(gain, feasible, chosen)
        if c is None:
            break
        hit = ec == c
        S[er[hit]] += ew[hit]
        if conflicts is not None:
            feasible[conflicts(c)] = False
    value = float(f(S).sum() + base[chosen].sum())
    return chosen, value


def _merge(r: np.ndarray, c: np.ndarray, w: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum duplicate (row, column) entries."""
    keys, inv = np.unique(r * n_cols + c, return_inverse=True)
    return keys // n_cols, keys % n_cols, np.bincount(inv, w)


def greedy_all_members(
    er: np.ndarray,
    ec: np.ndarray,
    ew: np.ndarray,
    t0: np.ndarray,
    P: int,
    budget: int,
    new_row,
    phi: str = "log",
    conflicts=None,
) -> tuple[list[int], float]:
    """Greedy on the all-members ablation F(B) = Σ_{i∈B} φ(T_i), T_i = Σ_{j∈B∖{i}} w_ij (w symmetric), a
    heuristic (F is not submodular). The batch starts as the anchors: rows with current sums ``t0`` and
    sparse entries (row, candidate column, w); adding candidate c raises every T_r by w_rc and adds c's own
    row, T_c = Σ_r w_rc, whose entries to the other candidates are ``new_row(c) -> (columns, weights)``."""
    f = PHI[phi]
    T = list(map(float, t0))
    er, ec, ew = er.copy(), ec.copy(), ew.copy()
    feasible = np.ones(P, bool)
    chosen: list[int] = []
    for _ in range(min(budget, P)):
        Ta = np.asarray(T)
        colsum = np.bincount(ec, ew, minlength=P)
        gain = np.bincount(ec, f(Ta[er] + ew) - f(Ta[er]), minlength=P) + f(colsum)
        c = _take_best(gain, feasible, chosen)
        if c is None:
            break
        hit = ec == c
        for r, w in zip(er[hit], ew[hit]):
            T[r] += w
        row = len(T)
        T.append(float(colsum[c]))
        cols, ws = new_row(c)
        keep = cols != c
        er = np.concatenate([er, np.full(int(keep.sum()), row)])
        ec = np.concatenate([ec, cols[keep]])
        ew = np.concatenate([ew, ws[keep]])
        if conflicts is not None:
            feasible[conflicts(c)] = False
    return chosen, float(f(np.asarray(T)).sum())


# ------------------------------------------------------------------------------ epoch re-ordering
def _random_fill(
    batch: list, size: int, avail: np.ndarray, blocked: np.ndarray, h: HobitGraph, rng: np.random.Generator
) -> int:
    """Grow ``batch`` to ``size`` with random unassigned examples compatible with it (any unassigned one when
    none is: a forced incompatible fill), each taken out of ``avail`` and its contradictions ``blocked``.
    Returns the number of forced fills."""
    forced = 0
    while len(batch) < size:
        free = np.flatnonzero(avail & ~blocked)
        if len(free) == 0:
            free = np.flatnonzero(avail)
            forced += 1
        j = int(rng.choice(free))
        batch.append(j)
        avail[j] = False
        blocked[h.contra.row(j)] = True
    return forced


def hobit_epoch(
    h: HobitGraph,
    b: int,
    rng: np.random.Generator,
    phi: str = "log",
    anchors: str = "knn",
    objective: str = "anchors_fixed",
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """One epoch of HOBIT batches (card §Greedy epoch re-ordering): seed a batch with a random unassigned
    example, take b/2 anchors (the seed's nearest compatible unassigned neighbours, or random ones), then
    b/2 members by greedy F_A over the unassigned examples compatible with every anchor, with the pairwise
    filter among members; random compatible fill when no gain is positive. Batches are shuffled.
    ``objective="all_members"``: the ablation's greedy (every member's term counts; heuristic).
    Returns (batches, the objective of each batch, number of forced incompatible fills)."""
    n, m = h.g.idx.shape
    n_a = b // 2
    avail = np.ones(n, bool)
    pos = np.full(n, -1, np.int64)
    order = rng.permutation(n)
    ptr = 0
    batches, values, forced = [], [], 0
    for _ in range(n // b):
        blocked = np.zeros(n, bool)
        while not avail[order[ptr]]:
            ptr += 1
        seed = int(order[ptr])
        A = [seed]
        avail[seed] = False
        blocked[h.contra.row(seed)] = True
        if anchors == "knn":
            for j in h.g.idx[seed]:
                if len(A) == n_a:
                    break
                if avail[j] and not blocked[j]:
                    A.append(int(j))
                    avail[j] = False
                    blocked[h.contra.row(j)] = True
        forced += _random_fill(A, n_a, avail, blocked, h, rng)
        A_arr = np.asarray(A)
        fwd = h.g.idx[A_arr].ravel()
        fw = h.a[A_arr].ravel()
        fr = np.repeat(np.arange(n_a), m)
        rq = np.concatenate([h.rev.row(i) for i in A])
        rw = np.concatenate([h.rev.row_data(i) for i in A])
        cand = np.unique(np.concatenate([fwd, rq]))
        cand = cand[avail[cand] & ~blocked[cand]]
        pos[cand] = np.arange(len(cand))
        keep = (pos[fwd] >= 0) & (fw > 0)
        er, ec, ew = fr[keep], pos[fwd[keep]], fw[keep]
        okr = pos[rq] >= 0
        v = np.bincount(pos[rq[okr]], rw[okr], minlength=len(cand))

        def conflicts(c: int, cand=cand) -> np.ndarray:
            p = pos[h.contra.row(int(cand[c]))]
            return p[p >= 0]

        conf = conflicts if h.contra.indices.size else None
        if objective == "all_members":
            chosen, value = _all_members_batch(h, A_arr, cand, pos, rq, rw, fr, fwd, fw, n_a, phi, conf)
        else:
            chosen, value = greedy_members(er, ec, ew, v, n_a, n_a, phi, conf)
        members = cand[chosen]
        pos[cand] = -1
        avail[members] = False
        for j in members:
            blocked[h.contra.row(int(j))] = True
        members = list(members)
        forced += _random_fill(members, b - n_a, avail, blocked, h, rng)
        members = np.asarray(members, np.int64)
        batches.append(np.concatenate([A_arr, members]))
        if len(chosen) < len(members):  # random fill: the objective of the batch as built
            value = (
                batch_objective(h, A_arr, members, phi)
                if objective == "anchors_fixed"
                else all_members_value(h, np.concatenate([A_arr, members]), phi)
            )
        values.append(value)
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm], np.asarray(values)[perm], forced


def _all_members_batch(
    h: HobitGraph,
    A: np.ndarray,
    cand: np.ndarray,
    pos: np.ndarray,
    rq,
    rw,
    fr,
    fwd,
    fw,
    budget: int,
    phi: str,
    conflicts,
) -> tuple[list[int], float]:
    """The all-members greedy for one batch: symmetric weights w = (a + aᵀ)/2 on the top-M graph."""
    n_a, P = len(A), len(cand)
    rrow = np.repeat(np.arange(n_a), [h.rev.indptr[i + 1] - h.rev.indptr[i] for i in A])
    okf, okr = pos[fwd] >= 0, pos[rq] >= 0
    er, ec, ew = _merge(
        np.concatenate([fr[okf], rrow[okr]]),
        np.concatenate([pos[fwd[okf]], pos[rq[okr]]]),
        np.concatenate([fw[okf], rw[okr]]) / 2,
        P,
    )
    t0 = np.array([(h.a[i] * np.isin(h.g.idx[i], A)).sum() / 2 for i in A])
    t0 += np.array([(h.rev.row_data(i) * np.isin(h.rev.row(i), A)).sum() / 2 for i in A])

    def new_row(c: int) -> tuple[np.ndarray, np.ndarray]:
        j = int(cand[c])
        cols = np.concatenate([h.g.idx[j], h.rev.row(j)])
        ws = np.concatenate([h.a[j], h.rev.row_data(j)]) / 2
        p = pos[cols]
        ok = p >= 0
        _, cc, ww = _merge(np.zeros(int(ok.sum()), np.int64), p[ok], ws[ok], P)
        return cc, ww

    return greedy_all_members(er, ec, ew, t0, P, budget, new_row, phi, conflicts)


def all_members_value(h: HobitGraph, Bset: np.ndarray, phi: str = "log") -> float:
    """F(B) of the all-members ablation for a built batch, from the sparse weights."""
    fwd = (h.a[Bset] * np.isin(h.g.idx[Bset], Bset)).sum(1)
    rev = np.array([(h.rev.row_data(i) * np.isin(h.rev.row(i), Bset)).sum() for i in Bset])
    return float(PHI[phi]((fwd + rev) / 2).sum())


def batch_objective(h: HobitGraph, A: np.ndarray, S: np.ndarray, phi: str = "log") -> float:
    """F_A(S) of a built batch, from the sparse weights (pairs outside the top-M graph weigh 0)."""
    f = PHI[phi]
    fwd = (h.a[A] * np.isin(h.g.idx[A], S)).sum(1)
    rev = (h.a[S] * np.isin(h.g.idx[S], A)).sum(1)
    return float(f(fwd).sum() + f(rev).sum())


# --------------------------------------------------------------------------------------- baselines
def random_batches(n: int, b: int, rng: np.random.Generator) -> list[np.ndarray]:
    perm = rng.permutation(n)
    return [perm[i * b : (i + 1) * b] for i in range(n // b)]


def cluster_batches(labels: np.ndarray, b: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Clusters (k-means, communities) in random order, members shuffled, concatenated and cut into batches
    of exactly b: large clusters are split, small ones merged with their neighbours in the order."""
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    seq = np.concatenate([rng.permutation(groups[i]) for i in rng.permutation(len(groups))])
    batches = [seq[i * b : (i + 1) * b] for i in range(len(seq) // b)]
    return [batches[i] for i in rng.permutation(len(batches))]


def kmeans_labels(x: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """TAS-B-style topic clusters of the query embeddings."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=n_clusters, n_init=1, max_iter=50, random_state=seed).fit_predict(x)


def louvain_labels(g: ScoreGraph, k: int, skip_top: int, resolution: float, seed: int) -> np.ndarray:
    """B3-like: a kNN graph over examples that skips each query's top-p neighbours (likely false
    negatives), Louvain communities (networkx)."""
    import networkx as nx

    n = g.n
    nb = g.idx[:, skip_top : skip_top + k]
    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from(zip(np.repeat(np.arange(n), nb.shape[1]).tolist(), nb.ravel().tolist()))
    labels = np.empty(n, np.int64)
    for c, members in enumerate(nx.community.louvain_communities(G, resolution=resolution, seed=seed)):
        labels[list(members)] = c
    return labels


def walk_batches(nbrs: np.ndarray, b: int, restart: float, rng: np.random.Generator) -> list[np.ndarray]:
    """BatchSampler-like: each batch is the set of new, unassigned nodes visited by a random walk with
    restart from a random unassigned start on the kNN graph; a walk that finds nothing new for 4b steps
    jumps to a random unassigned node (which becomes the restart node)."""
    n, k = nbrs.shape
    avail = np.ones(n, bool)
    order = rng.permutation(n)
    ptr = 0
    batches = []
    buf_u, buf_j, bi = rng.random(1 << 16), rng.integers(0, k, 1 << 16), 0
    for _ in range(n // b):
        while not avail[order[ptr]]:
            ptr += 1
        start = cur = int(order[ptr])
        batch = [start]
        avail[start] = False
        stale = 0
        while len(batch) < b:
            if bi == len(buf_u):
                buf_u, buf_j, bi = rng.random(1 << 16), rng.integers(0, k, 1 << 16), 0
            u, j = buf_u[bi], buf_j[bi]
            bi += 1
            cur = start if u < restart else int(nbrs[cur, j])
            if avail[cur]:
                batch.append(cur)
                avail[cur] = False
                stale = 0
            else:
                stale += 1
                if stale > 4 * b:
                    start = cur = int(rng.choice(np.flatnonzero(avail)))
                    batch.append(cur)
                    avail[cur] = False
                    stale = 0
        batches.append(np.asarray(batch, np.int64))
    return [batches[i] for i in rng.permutation(len(batches))]


def mine_negatives(g: ScoreGraph, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    """ANCE-lite: for each query one document drawn uniformly from its ranks lo..hi (1-based, positive
    excluded) under the current encoder."""
    hi = min(hi, g.idx.shape[1])
    lo = min(lo, hi)
    r = rng.integers(lo - 1, hi, size=g.n)
    return g.idx[np.arange(g.n), r]


# ------------------------------------------------------------------------------------- diagnostics
def false_negatives(
    batches: list[np.ndarray], facts: np.ndarray, mined: np.ndarray | None = None
) -> tuple[float, float]:
    """(co-batched duplicate pairs per batch, share of queries whose negatives include a duplicate of their
    positive: in-batch or, with mining, the mined negatives shared by the batch)."""
    pairs, hit, total = 0, 0, 0
    for bt in batches:
        f = facts[bt]
        _, counts = np.unique(f, return_counts=True)
        pairs += int((counts * (counts - 1) // 2).sum())
        docs = f if mined is None else np.concatenate([f, facts[mined[bt]]])
        same = f[:, None] == docs[None, :]
        same[np.arange(len(bt)), np.arange(len(bt))] = False
        if mined is not None:  # a mined doc that is the query's own positive document is masked in the loss
            own = mined[bt][None, :] == bt[:, None]
            same[:, len(bt) :] &= ~own
        hit += int(same.any(1).sum())
        total += len(bt)
    return pairs / max(len(batches), 1), hit / max(total, 1)
