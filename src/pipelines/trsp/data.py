"""Instances of `trsp` as one table (card: "Data"): the seeded small-market carpool city over the (k, γ)
grid, the A → B versus C_j → D_j gadget family, and (full env) the user's trips. One row per agent or
candidate stop; the train nodes rebuild the distance form (``instance.Instance``) from it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema, read_user_file
from pipelines.trsp.instance import Instance, from_metric, from_points
from pipelines.trsp.params import Params

COLUMNS = ["instance", "family", "seed", "k", "gamma", "param", "role", "group", "sx", "sy", "tx", "ty"]
AGENTS = TableSchema(
    "trsp.user_agents",
    {"sx": "number", "sy": "number", "tx": "number", "ty": "number"},
    min_rows=2,
    no_missing=("sx", "sy", "tx", "ty"),
)
CANDIDATES = TableSchema("trsp.user_candidates", {"x": "number", "y": "number"}, min_rows=2, no_missing=("x", "y"))
NODES = TableSchema(
    "trsp.user_graph_nodes",
    {"node": "int", "x": "number", "y": "number"},
    min_rows=2,
    no_missing=("x", "y"),
    unique=("node",),
)
EDGES = TableSchema(
    "trsp.user_graph_edges",
    {"u": "int", "v": "int", "length_km": "number"},
    min_rows=1,
    no_missing=("length_km",),
    finite=("length_km",),
    ranges={"length_km": (0, None)},
    refs={"u": (NODES.dataset, "node"), "v": (NODES.dataset, "node")},
)
GRAPH_COLUMNS = ["kind", "node", "x", "y", "u", "v", "length_km"]

# City layout on [0, L]² as fractions of L: three residential clusters, a remote minority suburb and
# two job centres (a centre-east business district and a smaller one west).
RESIDENTIAL = [(0.20, 0.75), (0.30, 0.25), (0.65, 0.85)]
MINORITY = (0.92, 0.08)
JOBS = [(0.55, 0.45), (0.25, 0.50)]


def _clip(x: np.ndarray, L: float) -> np.ndarray:
    return np.clip(x, 0.0, L)


def city_trips(c, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sources, destinations, group labels) of the carpool city."""
    L, n = c.plane_km, c.n_agents
    n_min = int(round(c.minority_share * n))
    n_res = n - n_min
    home = rng.integers(0, len(RESIDENTIAL), n_res)
    centres = np.array(RESIDENTIAL) * L
    s = np.vstack(
        [
            centres[home] + rng.normal(0, c.residential_sigma_km, (n_res, 2)),
            np.array(MINORITY) * L + rng.normal(0, c.residential_sigma_km, (n_min, 2)),
        ]
    )
    groups = np.array([f"res{h}" for h in home] + ["minority"] * n_min)
    shares = np.array([*c.job_shares, 1 - sum(c.job_shares)])
    job = rng.choice(3, n, p=shares / shares.sum())
    jobs = np.array(JOBS) * L
    t = np.where(
        (job < 2)[:, None], jobs[np.minimum(job, 1)] + rng.normal(0, c.job_sigma_km, (n, 2)), rng.uniform(0, L, (n, 2))
    )
    return _clip(s, L), _clip(t, L), groups


def candidate_stops(s: np.ndarray, t: np.ndarray, n_kmeans: int, grid: list[int], L: float, seed: int) -> np.ndarray:
    """k-means++ centres of all endpoints plus a regular grid (duplicates dropped)."""
    pts = []
    if n_kmeans:
        from sklearn.cluster import kmeans_plusplus

        X = np.vstack([s, t])
        centres, _ = kmeans_plusplus(X, n_clusters=min(n_kmeans, len(X)), random_state=seed)
        pts.append(centres)
    gx, gy = grid
    if gx and gy:
        xx, yy = np.meshgrid((np.arange(gx) + 0.5) * L / gx, (np.arange(gy) + 0.5) * L / gy)
        pts.append(np.stack([xx.ravel(), yy.ravel()], 1))
    cand = np.vstack(pts)
    return np.unique(np.round(cand, 9), axis=0)


def _rows(name: str, family: str, seed: int, k: int, gamma: float, param: float, s, t, groups, cand) -> pd.DataFrame:
    n, m = len(s), len(cand)
    return pd.DataFrame(
        {
            "instance": name,
            "family": family,
            "seed": seed,
            "k": k,
            "gamma": float(gamma),
            "param": float(param),
            "role": ["agent"] * n + ["candidate"] * m,
            "group": list(groups) + ["stop"] * m,
            "sx": np.r_[s[:, 0], cand[:, 0]],
            "sy": np.r_[s[:, 1], cand[:, 1]],
            "tx": np.r_[t[:, 0], np.full(m, np.nan)],
            "ty": np.r_[t[:, 1], np.full(m, np.nan)],
        }
    )


def gadget_points(
    walk_ab: float, walk_cd: float, jitter: float, n_random: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n = 24, k = 4 (g = 12): twelve agents A → B (walk ``walk_ab``) and two groups of six C_j → D_j
    (walk ``walk_cd``), the C_j 4 km apart; candidates A, B, C_j, D_j and ``n_random`` uniform points."""
    A, B = np.array([0.0, 0.0]), np.array([walk_ab, 0.0])
    C = [np.array([0.0, 4.0]), np.array([0.0, 8.0])]
    D = [c + [walk_cd, 0.0] for c in C]
    s = np.array([A] * 12 + [C[0]] * 6 + [C[1]] * 6) + rng.normal(0, jitter, (24, 2))
    t = np.array([B] * 12 + [D[0]] * 6 + [D[1]] * 6) + rng.normal(0, jitter, (24, 2))
    groups = np.array(["ab"] * 12 + ["cd1"] * 6 + ["cd2"] * 6)
    lo, hi = np.array([-1.0, -1.0]), np.array([max(walk_ab, walk_cd) + 1.0, 9.0])
    cand = np.vstack([A, B, C[0], D[0], C[1], D[1], rng.uniform(lo, hi, (n_random, 2))])
    return s, t, groups, cand


def read_table(path: str, key: str) -> pd.DataFrame:
    """A user's .csv or .parquet table (parameter ``trsp.data.user.<key>``); a missing or unreadable file
    names the parameter and the file."""
    return read_user_file(path, key=f"trsp.data.user.{key}", kind=("csv", "parquet"))


def user_rows(p: Params) -> list[pd.DataFrame]:
    u, c = p.data.user, p.data.city
    agents = read_table(u.agents_path, "agents_path")
    cands = read_table(u.candidates_path, "candidates_path") if u.candidates_path else None  # read, then checked
    agents = AGENTS.check(agents)
    s = agents[["sx", "sy"]].to_numpy(float)
    t = agents[["tx", "ty"]].to_numpy(float)
    groups = agents["group"].astype(str).to_numpy() if "group" in agents else np.array(["all"] * len(s))
    if cands is not None:
        cand = CANDIDATES.check(cands)[["x", "y"]].to_numpy(float)
    else:
        o = np.vstack([s, t]).min(0)  # the grid spans the trips' bounding square
        L = float(max(np.ptp(np.vstack([s, t]), 0).max(), 1e-9))
        cand = candidate_stops(s - o, t - o, c.n_kmeans_candidates, c.grid, L, 0) + o
    return [_rows(f"user_k{k}_g{g:g}", "user", 0, k, g, 0.0, s, t, groups, cand) for k in c.ks for g in c.gammas]


def make_instances(p: Params) -> pd.DataFrame:
    """Every instance of the run, one row per agent / candidate (columns ``COLUMNS``)."""
    frames = []
    c, gd = p.data.city, p.data.gadget
    for seed in p.seeds:
        if c.enabled:
            rng = np.random.default_rng([seed, 1])
            s, t, groups = city_trips(c, rng)
            cand = candidate_stops(s, t, c.n_kmeans_candidates, c.grid, c.plane_km, seed)
            frames += [
                _rows(f"city_s{seed}_k{k}_g{g:g}", "city", seed, k, g, 0.0, s, t, groups, cand)
                for k in c.ks
                for g in c.gammas
            ]
        if gd.enabled:
            for w in gd.walk_cd_km:
                rng = np.random.default_rng([seed, 2, int(round(w * 1000))])
                s, t, groups, cand = gadget_points(gd.walk_ab_km, w, gd.jitter_km, gd.n_random_candidates, rng)
                frames.append(_rows(f"gadget_w{w:g}_s{seed}", "gadget", seed, 4, 0.0, w, s, t, groups, cand))
    if p.data.user:
        frames += user_rows(p)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def make_graph(p: Params) -> pd.DataFrame:
    """The user's road graph as one table (``kind`` node / edge), checked; empty without one."""
    u = p.data.user
    if u is None or u.graph_nodes_path is None:
        return pd.DataFrame(
            {
                c: pd.Series(
                    dtype="float64" if c in ("x", "y", "length_km") else ("object" if c == "kind" else "int64")
                )
                for c in GRAPH_COLUMNS
            }
        )
    nodes, edges = (
        read_table(u.graph_nodes_path, "graph_nodes_path"),
        read_table(u.graph_edges_path, "graph_edges_path"),
    )
    nodes = NODES.check(nodes)
    edges = EDGES.check(edges, tables={NODES.dataset: nodes})
    return pd.concat(
        [nodes[["node", "x", "y"]].assign(kind="node"), edges[["u", "v", "length_km"]].assign(kind="edge")],
        ignore_index=True,
    )[GRAPH_COLUMNS]


def graph_distances(graph: pd.DataFrame, pts: np.ndarray) -> np.ndarray:
    """Shortest-path distances between points snapped to their nearest graph node (inf: unreachable)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import dijkstra
    from scipy.spatial import cKDTree

    nodes, edges = graph[graph.kind == "node"], graph[graph.kind == "edge"]
    index = {int(n): i for i, n in enumerate(nodes.node)}
    N = len(index)
    u = edges.u.astype(int).map(index).to_numpy()
    v = edges.v.astype(int).map(index).to_numpy()
    # parallel edges: keep the shortest (a sparse matrix would add them)
    w = pd.DataFrame({"a": np.minimum(u, v), "b": np.maximum(u, v), "w": edges.length_km.to_numpy(float)})
    w = w[w.a != w.b].groupby(["a", "b"], as_index=False).w.min()
    A = coo_matrix((w.w.to_numpy() + 1e-300, (w.a.to_numpy(), w.b.to_numpy())), shape=(N, N)).tocsr()
    snap = cKDTree(nodes[["x", "y"]].to_numpy(float)).query(pts)[1]
    uniq, inv = np.unique(snap, return_inverse=True)
    D = dijkstra(A, directed=False, indices=uniq)[:, uniq]
    return D[np.ix_(inv, inv)]


def to_instances(table: pd.DataFrame, metric: str, graph: pd.DataFrame | None = None) -> list[tuple[dict, Instance]]:
    """The table back as (meta, Instance) pairs, in table order. The user's trips use the road graph's
    shortest paths when one is given; everything else the plane metric."""
    out = []
    road = graph is not None and len(graph) > 0
    for name, d in table.groupby("instance", sort=False):
        a, cnd = d[d.role == "agent"], d[d.role == "candidate"]
        meta = {k: d[k].iloc[0] for k in ("instance", "family", "seed", "k", "gamma", "param")}
        meta = {k: (v.item() if hasattr(v, "item") else v) for k, v in meta.items()}
        s, t, cand = a[["sx", "sy"]].to_numpy(), a[["tx", "ty"]].to_numpy(), cnd[["sx", "sy"]].to_numpy()
        if road and meta["family"] == "user":
            n, m = len(s), len(cand)
            D = graph_distances(graph, np.vstack([s, t, cand]))
            inst = from_metric(
                D,
                np.arange(n),
                np.arange(n, 2 * n),
                np.arange(2 * n, 2 * n + m),
                int(meta["k"]),
                float(meta["gamma"]),
                name=str(name),
                groups=a["group"].to_numpy(),
                coords={"s": s, "t": t, "cand": cand},
            )
        else:
            inst = from_points(
                s, t, cand, int(meta["k"]), float(meta["gamma"]), metric, name=str(name), groups=a["group"].to_numpy()
            )
        out.append((meta, inst))
    return out
