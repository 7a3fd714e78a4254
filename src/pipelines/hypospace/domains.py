"""The three HypoSpace domains (paper §3): each has a finite hypothesis space H, a deterministic validator
that recomputes what a hypothesis predicts, an exact enumerator of the admissible set A(obs) ⊆ H, a
canonical key (the identity used by Uniqueness and Recovery), a text format for LLM samplers with a
tolerant parser, and a one-step corruption (the `noisy` sampler).

- causal: DAGs on n nodes; perturbing v sets v to 0, its descendants to 1, every other node to 0.
- voxel3d: g×g grid, at most H layers, gravity (a block at layer z needs one at z−1 in the same cell);
  the observation is the top view; a gravity-consistent structure is its height map.
- boolean: expressions over variables with AND/OR/NOT (+ XOR/NOR), AST depth ≤ D, no constants;
  the observation is a partial truth table; identity is the mechanistic key (commutativity, AND/OR
  idempotence, associativity flattening of AND/OR/XOR; no distributivity, absorption or De Morgan).

Validators never use the enumerators' data structures (they recompute from the hypothesis object), so
the tests can check one against the other.
"""

from __future__ import annotations

import itertools
import json
import re
from functools import lru_cache

import numpy as np

LETTERS = "ABCDEFGHIJ"


class _Enumerated:
    """The sampler helpers of a domain whose space H is enumerated in full: per hypothesis (an index into
    ``keys``) a complexity score and a stratum (what the stratified sampler balances), which the domain
    sets as the arrays ``complexities`` and ``strata``; the prior draws keys uniformly from H."""

    keys: list[str]
    complexities: np.ndarray
    strata: np.ndarray

    def complexity(self, idx: np.ndarray) -> np.ndarray:
        return self.complexities[idx]

    def stratum(self, idx: np.ndarray) -> np.ndarray:
        return self.strata[idx]

    def sample_prior(self, rng: np.random.Generator, size: int) -> list[str]:
        return [self.keys[i] for i in rng.integers(len(self.keys), size=size)]


# ============================================================================================ causal
class Causal(_Enumerated):
    """DAGs on ``n`` labelled nodes (A, B, ...). Hypothesis object: a frozenset of edges (i, j)."""

    name = "causal"

    def __init__(self, n: int):
        if not 2 <= n <= 5:
            raise ValueError(f"causal: n = {n} nodes; exact enumeration supports 2..5 (29,281 DAGs at n = 5)")
        self.n = n
        self.config = f"n{n}"
        self._enumerate()

    # ---- enumeration: every DAG has a topological order; edges only go forward in it
    def _enumerate(self) -> None:
        n = self.n
        seen: dict[int, int] = {}
        masks, desc_rows = [], []
        for order in itertools.permutations(range(n)):
            pairs = [(order[a], order[b]) for a in range(n) for b in range(a + 1, n)]
            for sub in range(1 << len(pairs)):
                mask = 0
                for k, (i, j) in enumerate(pairs):
                    if sub >> k & 1:
                        mask |= 1 << (i * n + j)
                if mask in seen:
                    continue
                seen[mask] = len(masks)
                desc = [0] * n
                for v in reversed(order):  # children come later in the order: already closed
                    d = 0
                    for c in range(n):
                        if mask >> (v * n + c) & 1:
                            d |= (1 << c) | desc[c]
                    desc[v] = d
                masks.append(mask)
                desc_rows.append(desc)
        order = np.argsort([self._mask_key(m) for m in masks], kind="stable")
        self.masks = np.array(masks, dtype=np.int64)[order]
        self.desc = np.array(desc_rows, dtype=np.int64)[order]  # (|H|, n) descendant bitmasks
        self.keys = [self._mask_key(int(m)) for m in self.masks]
        self.n_edges = np.array([bin(int(m)).count("1") for m in self.masks])
        self.complexities, self.strata = self.n_edges.astype(float), self.n_edges

    def _mask_key(self, mask: int) -> str:
        n = self.n
        edges = [(i, j) for i in range(n) for j in range(n) if i != j and mask >> (i * n + j) & 1]
        return self.key(frozenset(edges))

    @property
    def space_size(self) -> int:
        return len(self.keys)

    # ---- keys and objects
    def key(self, edges) -> str:
        return ",".join(f"{LETTERS[i]}->{LETTERS[j]}" for i, j in sorted(edges)) or "none"

    def from_key(self, key: str):
        return self.parse_edges(key)

    def parse_edges(self, s: str):
        if s.strip().lower() in ("none", "empty", "", "{}", "[]", "∅"):
            return frozenset()
        edges = set()
        for a, b in re.findall(r"\b([A-Za-z])\s*(?:->|→|-->|=>)\s*([A-Za-z])\b", s):
            i, j = LETTERS.find(a.upper()), LETTERS.find(b.upper())
            if i < 0 or j < 0:
                return None
            edges.add((i, j))
        return frozenset(edges) if edges else None

    # ---- observations
    def observe(self, obs: dict) -> dict[int, int]:
        """{perturbed node: descendant bitmask} of a stored observation."""
        return {int(v): sum(1 << c for c in d) for v, d in obs["perturbed"].items()}

    def admissible(self, obs: dict) -> np.ndarray:
        ok = np.ones(len(self.keys), dtype=bool)
        for v, d in self.observe(obs).items():
            ok &= self.desc[:, v] == d
        return np.flatnonzero(ok)

    def make_obs(self, truth: int, nodes) -> dict:
        return {
            "n": self.n,
            "perturbed": {
                str(int(v)): [c for c in range(self.n) if self.desc[truth, v] >> c & 1] for v in sorted(nodes)
            },
        }

    def validate(self, edges, obs: dict) -> bool:
        """Recompute: nodes in range, no self-loops, acyclic, descendants of each perturbed node."""
        if edges is None:
            return False
        n = self.n
        if any(not (0 <= i < n and 0 <= j < n) or i == j for i, j in edges):
            return False
        children = {v: [j for i, j in edges if i == v] for v in range(n)}
        indeg = {v: 0 for v in range(n)}
        for _, j in edges:
            indeg[j] += 1
        queue, seen = [v for v in range(n) if indeg[v] == 0], 0
        while queue:  # Kahn: a cycle leaves nodes unvisited
            v = queue.pop()
            seen += 1
            for c in children[v]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    queue.append(c)
        if seen < n:
            return False
        for v, want in obs["perturbed"].items():
            stack, reach = list(children[int(v)]), set()
            while stack:
                c = stack.pop()
                if c not in reach:
                    reach.add(c)
                    stack.extend(children[c])
            if reach != set(want):
                return False
        return True

    # ---- sampler helpers
    def perturb(self, edges, rng: np.random.Generator):
        i, j = rng.choice(self.n, size=2, replace=False)
        return frozenset(set(edges) ^ {(int(i), int(j))})

    # ---- LLM text
    def render(self, edges) -> str:
        return "Graph: " + (", ".join(f"{LETTERS[i]}->{LETTERS[j]}" for i, j in sorted(edges)) or "none")

    def parse_text(self, text: str):
        m = re.search(r"graph\s*:\s*(.*)", text, flags=re.I)
        body = m.group(1) if m else text.strip().splitlines()[-1] if text.strip() else ""
        return self.parse_edges(body.replace("[", " ").replace("]", " ").replace("(", " ").replace(")", " "))

    def stratum_hint(self, s: int) -> str:
        return f"Your graph must have exactly {s} edge{'s' if s != 1 else ''}."

    def prompt(self, obs: dict, prior: list[str]) -> str:
        names = ", ".join(LETTERS[: self.n])
        lines = []
        for v, d in obs["perturbed"].items():
            vals = ", ".join(f"{LETTERS[c]}={int(c in d)}" for c in range(self.n))
            lines.append(f"- perturbing {LETTERS[int(v)]}: {vals}")
        prior_txt = "\n".join(f"Graph: {k}" for k in prior) or "(none yet)"
        return (
            f"A causal system has the variables {names}; its structure is an unknown directed acyclic graph.\n"
            "Perturbing a variable sets it to 0; every variable downstream of it (a descendant) then reads 1 "
            "and every other variable reads 0.\n"
            f"Experiments:\n{chr(10).join(lines)}\n"
            f"Graphs proposed so far (do not repeat any of them):\n{prior_txt}\n"
            "Propose ONE directed acyclic graph consistent with every experiment. Answer with a single line "
            "'Graph: ' followed by the edges as X->Y separated by commas, or 'Graph: none' for no edges."
        )


# ============================================================================================ voxel3d
class Voxel3D:
    """Gravity-constrained structures on a g×g grid with at most H layers. Hypothesis object: a bool
    array (layers, g, g), layer 0 at the bottom; its key is the height map when gravity holds."""

    name = "voxel3d"

    def __init__(self, grid: int, max_height: int):
        self.g, self.H = grid, max_height
        self.config = f"g{grid}_H{max_height}"

    @property
    def space_size(self) -> int:
        return (self.H + 1) ** (self.g * self.g)

    @staticmethod
    def strip(vox: np.ndarray) -> np.ndarray:
        L = vox.shape[0]
        while L and not vox[L - 1].any():
            L -= 1
        return vox[:L]

    def key(self, vox: np.ndarray) -> str:
        vox = self.strip(np.asarray(vox, dtype=bool))
        if vox.shape[0] == 0:
            return "/".join("0" * vox.shape[2] for _ in range(vox.shape[1])) if vox.ndim == 3 else "empty"
        if all((vox[z] <= vox[z - 1]).all() for z in range(1, vox.shape[0])):  # gravity: a height map
            h = vox.sum(0)
            if h.max() < 10:
                return "/".join("".join(str(int(x)) for x in row) for row in h)
        return "layers:" + "|".join("/".join("".join(str(int(x)) for x in row) for row in layer) for layer in vox)

    def heights_to_vox(self, h: np.ndarray) -> np.ndarray:
        h = np.asarray(h).reshape(self.g, self.g)
        L = max(int(h.max()), 0)
        return np.stack([h > z for z in range(L)]) if L else np.zeros((0, self.g, self.g), dtype=bool)

    def from_key(self, key: str):
        if key.startswith("layers:"):
            return np.array(
                [[[c == "1" for c in row] for row in layer.split("/")] for layer in key[7:].split("|")], dtype=bool
            )
        return self.heights_to_vox(np.array([[int(c) for c in row] for row in key.split("/")]))

    def admissible_heights(self, top: np.ndarray) -> np.ndarray:
        """All height maps (|A|, g*g) with h > 0 exactly on the top view: H^{#ones} of them."""
        cells = np.flatnonzero(np.asarray(top).ravel())
        combos = np.array(list(itertools.product(range(1, self.H + 1), repeat=len(cells))), dtype=np.int64)
        out = np.zeros((len(combos), self.g * self.g), dtype=np.int64)
        out[:, cells] = combos
        return out

    def validate(self, vox, obs: dict) -> bool:
        if vox is None:
            return False
        vox = np.asarray(vox)
        if vox.ndim != 3 or vox.shape[1:] != (self.g, self.g) or not np.isin(vox, (0, 1)).all():
            return False
        vox = self.strip(vox.astype(bool))
        if vox.shape[0] > self.H:
            return False
        for z in range(1, vox.shape[0]):
            if (vox[z] & ~vox[z - 1]).any():  # a floating block
                return False
        top = vox.any(0) if vox.shape[0] else np.zeros((self.g, self.g), dtype=bool)
        return bool((top == np.asarray(obs["top"], dtype=bool)).all())

    def sample_prior(self, rng: np.random.Generator, size: int) -> list[str]:
        hs = rng.integers(0, self.H + 1, size=(size, self.g, self.g))
        return ["/".join("".join(str(int(x)) for x in row) for row in h) for h in hs]

    def perturb(self, vox: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        full = np.zeros((self.H, self.g, self.g), dtype=bool)
        full[: vox.shape[0]] = vox[: self.H]
        z, r, c = rng.integers(self.H), rng.integers(self.g), rng.integers(self.g)
        full[z, r, c] = ~full[z, r, c]
        return self.strip(full)

    def render(self, vox: np.ndarray) -> str:
        vox = self.strip(np.asarray(vox, dtype=bool))
        parts = ["Structure:"]
        for z, layer in enumerate(vox, 1):
            parts.append(f"Layer {z}:")
            parts += [" ".join(str(int(x)) for x in row) for row in layer]
        return "\n".join(parts)

    def parse_text(self, text: str):
        body = text.split("Structure:", 1)[-1] if "Structure:" in text else text
        chunks = re.split(r"layer\s*\d+\s*:?", body, flags=re.I)[1:]
        if not chunks:
            return None
        layers = []
        for ch in chunks:
            digits = [int(d) for d in re.findall(r"\d", ch)][: self.g * self.g]  # "1 0 0", "[1,0,0]" or "100"
            if len(digits) < self.g * self.g or max(digits) > 1:
                return None
            layers.append(np.array(digits[: self.g * self.g], dtype=bool).reshape(self.g, self.g))
        return np.stack(layers)

    def stratum_hint(self, s: int) -> str:
        return f"Your structure must use exactly {s} block{'s' if s != 1 else ''} in total."

    def prompt(self, obs: dict, prior: list[str]) -> str:
        top = "\n".join(" ".join(str(int(x)) for x in row) for row in obs["top"])
        prior_txt = "\n\n".join(self.render(self.from_key(k)) for k in prior) or "(none yet)"
        return (
            f"A structure of unit blocks stands on a {self.g}x{self.g} grid with at most {self.H} layers. "
            "Gravity holds: a block above layer 1 needs a block directly below it.\n"
            f"Seen from above, a cell is 1 when it holds at least one block:\n{top}\n"
            f"Structures proposed so far (do not repeat any of them):\n{prior_txt}\n"
            "Propose ONE structure consistent with the top view. Answer 'Structure:' and then, for each layer "
            f"from the bottom, a line 'Layer k:' followed by {self.g} rows of {self.g} digits (1 = block)."
        )


# ============================================================================================ boolean
BINARY = ("AND", "OR", "XOR", "NOR")
ASSOCIATIVE = ("AND", "OR", "XOR")  # flattened; NOR is commutative but not associative
IDEMPOTENT = ("AND", "OR")
OPERATOR_SETS = {"basic": ("AND", "OR", "NOT"), "extended": ("AND", "OR", "NOT", "XOR", "NOR")}


class Expr(tuple):
    """A canonical expression node (op, children, text): op is 'VAR', 'CONST', 'NOT' or a binary op
    (n-ary after flattening); children are canonical nodes sorted by text (commutativity)."""

    __slots__ = ()

    @property
    def op(self) -> str:
        return self[0]

    @property
    def kids(self) -> tuple:
        return self[1]

    @property
    def text(self) -> str:
        return self[2]


def var(name: str) -> Expr:
    return Expr(("VAR", (name,), name))


def const(v: int) -> Expr:
    return Expr(("CONST", (int(v),), str(int(v))))


def make(op: str, kids) -> Expr:
    """The canonical node op(kids): flatten nested identical associative ops, drop duplicate children
    under AND/OR, sort the children of commutative ops. Nothing else (no absorption, De Morgan...)."""
    if op == "NOT":
        (k,) = kids
        return Expr(("NOT", (k,), "NOT " + k.text))
    flat = []
    for k in kids:
        flat.extend(k.kids if op in ASSOCIATIVE and k.op == op else (k,))
    if op in IDEMPOTENT:
        flat = list({k.text: k for k in flat}.values())
        if len(flat) == 1:  # x AND x = x
            return flat[0]
    flat.sort(key=lambda k: k.text)
    return Expr((op, tuple(flat), "(" + f" {op} ".join(k.text for k in flat) + ")"))


def depth(e: Expr) -> int:
    """The least AST depth of any binary expression with this key (leaves 0): an n-ary node combines
    its children's depths pairwise, shallowest first (a Huffman-like merge)."""
    if e.op in ("VAR", "CONST"):
        return 0
    if e.op == "NOT":
        return 1 + depth(e.kids[0])
    ds = sorted(depth(k) for k in e.kids)
    while len(ds) > 1:
        a, b = ds.pop(0), ds.pop(0)
        ds.append(max(a, b) + 1)
        ds.sort()
    return ds[0]


def size(e: Expr) -> int:
    return 1 if e.op in ("VAR", "CONST") else 1 + sum(size(k) for k in e.kids)


def ops_used(e: Expr) -> set[str]:
    if e.op == "VAR":
        return set()
    if e.op == "CONST":
        return {"CONST"}
    return {e.op}.union(*(ops_used(k) for k in e.kids))


def vars_used(e: Expr) -> set[str]:
    if e.op == "VAR":
        return {e.kids[0]}
    if e.op == "CONST":
        return set()
    return set().union(*(vars_used(k) for k in e.kids))


def truth_table(e: Expr, variables: tuple[str, ...]) -> int:
    """Bit r of the result is the value on input row r (row r: variable i = bit (nv−1−i) of r)."""
    nv = len(variables)
    rows = 1 << nv
    full = (1 << rows) - 1
    if e.op == "VAR":
        i = variables.index(e.kids[0])
        return sum(1 << r for r in range(rows) if r >> (nv - 1 - i) & 1)
    if e.op == "CONST":
        return full if e.kids[0] else 0
    t = [truth_table(k, variables) for k in e.kids]
    if e.op == "NOT":
        return full ^ t[0]
    acc = t[0]
    for x in t[1:]:
        acc = acc & x if e.op == "AND" else acc | x if e.op == "OR" else acc ^ x if e.op == "XOR" else full ^ (acc | x)
    return acc


_TOKEN = re.compile(r"\s*(\(|\)|,|[A-Za-z_][A-Za-z_0-9]*|[01]|\S)")
_SYMBOLS = [
    (r"\\land|\\wedge|∧|&&|&|\*|·", " AND "),
    (r"\\lor|\\vee|∨|\|\||\||\+", " OR "),
    (r"\\oplus|⊕|\^|\\veebar|⊻", " XOR "),
    (r"\\lnot|\\neg|¬|!|~", " NOT "),
    (r"⊽|↓", " NOR "),
    (r"\\text\{([^}]*)\}", r"\1"),
    (r"\\[()\[\]]|\$|`", " "),
]


def parse_expr(text: str) -> Expr | None:
    """Infix (NOT > AND > XOR/NOR > OR, left to right), or OP(a, b, ...) call syntax; case-insensitive
    operators; LaTeX / Unicode / C-style symbols. None when it does not parse."""
    s = text
    for pat, rep in _SYMBOLS:
        s = re.sub(pat, rep, s)
    toks = [t for t in _TOKEN.findall(s) if t.strip()]
    pos = 0

    def peek():
        return toks[pos].upper() if pos < len(toks) else None

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def level(ops):
        def parse_level():
            left = nxt[ops]()
            while peek() in ops:
                op = take().upper()
                left = make(op, (left, nxt[ops]()))
            return left

        return parse_level

    def unary():
        t = peek()
        if t == "NOT":
            take()
            return make("NOT", (unary(),))
        if t in BINARY and pos + 1 < len(toks) and toks[pos + 1] == "(":  # call syntax AND(a, b, c)
            op = take().upper()
            take()
            args = [or_()]
            while peek() == ",":
                take()
                args.append(or_())
            if take() != ")" or len(args) < 2:
                raise ValueError
            if op == "NOR":
                if len(args) != 2:
                    raise ValueError
                return make("NOR", args)
            return make(op, args)
        if t == "(":
            take()
            e = or_()
            if take() != ")":
                raise ValueError
            return e
        if t in ("TRUE", "FALSE", "0", "1"):
            take()
            return const(t in ("TRUE", "1"))
        if t is not None and re.fullmatch(r"[A-Za-z]", toks[pos]):
            return var(take().lower())
        raise ValueError

    nxt = {}
    and_ = level(("AND",))
    nxt[("AND",)] = unary
    xor_ = level(("XOR", "NOR"))
    nxt[("XOR", "NOR")] = and_
    or_ = level(("OR",))
    nxt[("OR",)] = xor_
    try:
        e = or_()
        if pos != len(toks):
            return None
        return e
    except (ValueError, IndexError):
        return None


class Boolean(_Enumerated):
    """Boolean expressions over ``variables`` with the operators of ``operator_set``, depth ≤ D."""

    name = "boolean"

    def __init__(self, variables: tuple[str, ...], operator_set: str, max_depth: int):
        self.variables, self.ops, self.D = tuple(variables), OPERATOR_SETS[operator_set], max_depth
        self.config = f"{operator_set}_v{len(variables)}_d{max_depth}"
        self.exprs = enumerate_expressions(self.variables, operator_set, max_depth)
        self.keys = [e.text for e in self.exprs]
        self.tt = np.array([truth_table(e, self.variables) for e in self.exprs], dtype=np.int64)
        self.sizes = np.array([size(e) for e in self.exprs])
        self.depths = np.array([depth(e) for e in self.exprs])
        self.complexities, self.strata = self.sizes.astype(float), self.depths

    @property
    def space_size(self) -> int:
        return len(self.keys)

    def key(self, e: Expr) -> str:
        return e.text

    def from_key(self, key: str):
        return parse_expr(key)

    def rows_mask(self, rows) -> tuple[int, int]:
        nv = len(self.variables)
        mask = out = 0
        for *inp, y in rows:
            r = sum(int(b) << (nv - 1 - i) for i, b in enumerate(inp))
            mask |= 1 << r
            out |= int(y) << r
        return mask, out

    def admissible(self, obs: dict) -> np.ndarray:
        mask, out = self.rows_mask(obs["rows"])
        return np.flatnonzero((self.tt & mask) == out)

    def make_obs(self, truth: int, rows) -> dict:
        nv = len(self.variables)
        t = int(self.tt[truth])
        return {
            "variables": list(self.variables),
            "operators": list(self.ops),
            "max_depth": self.D,
            "rows": [[int(r) >> (nv - 1 - i) & 1 for i in range(nv)] + [t >> int(r) & 1] for r in sorted(rows)],
        }

    def validate(self, e: Expr | None, obs: dict) -> bool:
        """Allowed variables and operators, no constants, depth ≤ D, and every observed row reproduced by
        evaluating the expression row by row (no bit-packed tables)."""
        if e is None or "CONST" in ops_used(e) or not ops_used(e) <= set(self.ops):
            return False
        if not vars_used(e) <= set(self.variables) or depth(e) > self.D:
            return False
        for *inp, y in obs["rows"]:
            if _eval(e, dict(zip(self.variables, inp))) != int(y):
                return False
        return True

    def perturb(self, e: Expr, rng: np.random.Generator) -> Expr:
        """Swap one operator for another of the same arity (a variable for another variable)."""
        nodes = []

        def walk(x, path):
            nodes.append(path)
            if x.op not in ("VAR", "CONST"):
                for i, k in enumerate(x.kids):
                    walk(k, path + (i,))

        walk(e, ())
        path = nodes[rng.integers(len(nodes))]

        def rebuild(x, p):
            if not p:
                if x.op == "VAR":
                    others = [v for v in self.variables if v != x.kids[0]]
                    return var(others[rng.integers(len(others))]) if others else make("NOT", (x,))
                if x.op == "NOT":
                    return x.kids[0]  # drop the negation
                others = [o for o in self.ops if o in BINARY and o != x.op]
                if not others:
                    return make("NOT", (x,))
                op = others[rng.integers(len(others))]
                kids = x.kids if op != "NOR" or len(x.kids) == 2 else (x.kids[0], make(x.op, x.kids[1:]))
                return make(op, kids)
            kids = list(x.kids)
            kids[p[0]] = rebuild(kids[p[0]], p[1:])
            return make(x.op, kids)

        return rebuild(e, path)

    def render(self, e: Expr) -> str:
        return "Expression: " + e.text

    def parse_text(self, text: str):
        for line in text.splitlines():
            m = re.search(r"expression\s*:\s*(.*)", line, flags=re.I)
            if m and m.group(1).strip():
                return parse_expr(m.group(1).strip().strip("`*\"'.;"))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return parse_expr(lines[-1].strip("`*\"'.;")) if lines else None

    def stratum_hint(self, s: int) -> str:
        return f"Your expression must have nesting depth exactly {s} (a bare variable has depth 0)."

    def prompt(self, obs: dict, prior: list[str]) -> str:
        rows = "\n".join(
            ", ".join(f"{v}={b}" for v, b in zip(self.variables, r[:-1])) + f" -> {r[-1]}" for r in obs["rows"]
        )
        prior_txt = "\n".join(f"Expression: {k}" for k in prior) or "(none yet)"
        return (
            f"An unknown Boolean function of {', '.join(self.variables)} was observed on some inputs:\n{rows}\n"
            f"Allowed operators: {', '.join(self.ops)}; no constants; nesting depth at most {self.D}.\n"
            "Two expressions count as the same when they differ only by the order of operands, repeated "
            "operands of AND/OR, or the grouping of a chain of one associative operator (AND, OR, XOR). "
            "Any other rewriting (distributivity, absorption, De Morgan) gives a different expression.\n"
            f"Expressions proposed so far (do not repeat any of them):\n{prior_txt}\n"
            "Propose ONE expression consistent with every observation. Answer with a single line "
            "'Expression: ' followed by the expression in plain text, e.g. 'Expression: (x AND NOT y)'."
        )


def _eval(e: Expr, env: dict[str, int]) -> int:
    if e.op == "VAR":
        return int(env[e.kids[0]])
    if e.op == "CONST":
        return int(e.kids[0])
    vals = [_eval(k, env) for k in e.kids]
    if e.op == "NOT":
        return 1 - vals[0]
    if e.op == "AND":
        return int(all(vals))
    if e.op == "OR":
        return int(any(vals))
    if e.op == "XOR":
        return sum(vals) % 2
    return int(not any(vals))  # NOR (binary)


@lru_cache(maxsize=16)
def enumerate_expressions(variables: tuple[str, ...], operator_set: str, max_depth: int) -> tuple[Expr, ...]:
    """Every mechanistic key of an expression of AST depth ≤ max_depth, bottom-up by depth and
    deduplicated by key (the key of op(a, b) depends only on the keys of a and b), sorted by key."""
    ops = OPERATOR_SETS[operator_set]
    level = {v: var(v) for v in variables}
    for _ in range(max_depth):
        prev = list(level.values())
        new = dict(level)
        for a in prev:
            if "NOT" in ops:
                e = make("NOT", (a,))
                new.setdefault(e.text, e)
            for op in ops:
                if op == "NOT":
                    continue
                for b in prev:
                    if op != "NOR" and b.text < a.text:  # commutative: one order suffices
                        continue
                    e = make(op, (a, b))
                    new.setdefault(e.text, e)
        level = new
    return tuple(sorted(level.values(), key=lambda e: e.text))


# ============================================================================================ factory
@lru_cache(maxsize=32)
def domain_for(name: str, config: str):
    """The domain object of one configuration string (cached: enumeration happens once per process)."""
    c = json.loads(config)
    if name == "causal":
        return Causal(c["n"])
    if name == "voxel3d":
        return Voxel3D(c["grid"], c["max_height"])
    if name == "boolean":
        return Boolean(tuple(c["variables"]), c["operator_set"], c["max_depth"])
    raise ValueError(f"unknown domain {name!r}")
