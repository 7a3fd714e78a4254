"""The ddNTK of M inputs at first order in 1/n: R, S, T, U as M x M x M x M arrays over (a1, a2, a3, a4), exact
at layer 2 and by the layer-to-layer recursion at every deeper layer (our derivation; definitions, formulas and
the probe estimator in ``ddntk2``'s docstring, which are index-wise and hold for any M).

There is ONE implementation of the formulas, ``ddntk2.ddntk_layers`` (with ``ddntk2._intra`` for layer 2): it takes
an expectation engine. ``ddntk2.two_input_ddntk`` runs it on the 2-D rule (``ddntk2._Grid``) with ``ntk2``'s
B, F, P, Q; this module runs it on :class:`Expect` (``multi.Expect`` plus s''') with B, F from
``multi.multi_input_ntk_tensors`` and P, Q from ``multi.multi_input_dntk``: each average on the rule of the
distinct inputs it touches (at most 4, so any M), Stein vectors from the sub-kernel of those inputs. Identical
inputs are computed once and their components copied (as in ``multi``).

Monte Carlo: ``ddntk2.sample_ddntk_probes`` (any M; M = 2 is ``sample_two_input_ddntk`` bit for bit) and
``ddntk2.pooled_two_input_ddntk`` (shape-driven), re-exported here as :func:`sample_multi_input_ddntk` and
:func:`pooled_multi_input_ddntk`.
"""

from __future__ import annotations

import numpy as np

from pipelines.ntk_feynman import ddntk, ddntk2, multi
from pipelines.ntk_feynman.theory import Quad

TENSORS = ddntk2.TENSORS
sample_multi_input_ddntk = ddntk2.sample_ddntk_probes
pooled_multi_input_ddntk = ddntk2.pooled_two_input_ddntk


class Expect(multi.Expect):
    """``multi.Expect`` with the factor "ddd" (sigma''') that the ddNTK's layer-2 and inter-layer terms need."""

    def _array(self, subset, fn: str, a: int) -> np.ndarray:
        if fn != "ddd":
            return super()._array(subset, fn, a)
        key = (subset, fn, a)
        if key not in self._arrays:
            self._arrays[key] = ddntk.d3sigma(self.kind, self.grid(subset)[0][a])
        return self._arrays[key]


def _expand(rows: list[dict], idx: list[int]) -> list[dict]:
    ix = np.ix_(idx, idx, idx, idx)
    return [{"layer": r["layer"], **{t: r[t][ix] for t in TENSORS}} for r in rows]


def multi_input_ddntk_layer2(
    kind: str, c_w: float, c_b: float, lambda_b: float, lambda_w: float, X: np.ndarray, quad: Quad | None = None
) -> dict[str, np.ndarray]:
    """R, S, T, U (each M^4 over (a1, a2, a3, a4)) at layer 2 for the M inputs X (M x n0), exact at any width."""
    quad = quad or Quad()
    X = np.atleast_2d(np.asarray(X, dtype=float))
    Xd, idx = multi._distinct(X)
    K, Th = ddntk2.gram(c_w, c_b, lambda_b, lambda_w, Xd)
    out = ddntk2._intra(Expect(kind, K, quad), c_w, lambda_w, Th)
    return _expand([{"layer": 2, **out}], idx)[0] if len(Xd) < len(X) else out


def multi_input_ddntk(
    kind: str,
    c_w: float,
    c_b: float,
    lambda_b: float,
    lambda_w: float,
    X: np.ndarray,
    depth: int,
    widths: list[int] | None = None,
    interlayer: bool = True,
    quad: Quad | None = None,
    h_rel: float = 1e-4,
) -> list[dict]:
    """Per layer l = 1..depth: {"layer", "R", "S", "T", "U"} (M^4 arrays) of the inputs X (M x n0) by
    ``ddntk2.ddntk_layers`` on :class:`Expect`, with K, Theta, B, F of ``multi.multi_input_ntk_tensors`` and P, Q
    of ``multi.multi_input_dntk`` (``widths``, ``interlayer``, ``h_rel`` passed on; ``interlayer=False`` keeps
    the layer-2 formulas at every layer: the ablation)."""
    quad = quad or Quad()
    X = np.atleast_2d(np.asarray(X, dtype=float))
    widths = widths or [1] * depth
    Xd, idx = multi._distinct(X)
    base = multi.multi_input_ntk_tensors(
        kind, c_w, c_b, lambda_b, lambda_w, Xd, depth, widths=widths, interlayer=interlayer, quad=quad, h_rel=h_rel
    )
    drows = (
        multi.multi_input_dntk(
            kind, c_w, c_b, lambda_b, lambda_w, Xd, depth, widths=widths, interlayer=interlayer, quad=quad, h_rel=h_rel
        )
        if interlayer
        else None
    )
    rows = ddntk2.ddntk_layers(lambda K: Expect(kind, K, quad), c_w, lambda_w, base, drows, widths, interlayer)
    return _expand(rows, idx) if len(Xd) < len(X) else rows


__all__ = [
    "Expect",
    "TENSORS",
    "multi_input_ddntk",
    "multi_input_ddntk_layer2",
    "pooled_multi_input_ddntk",
    "sample_multi_input_ddntk",
]
