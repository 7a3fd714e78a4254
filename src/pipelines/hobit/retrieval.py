"""Retrieval metrics of the test queries against the whole corpus (train + test documents): recall@k,
MRR@10 and nDCG@10 with binary relevance (a document is relevant when it shares the query's fact id).
The corpus is scored in chunks of queries with a top-k on the device, never as one queries × corpus matrix."""

from __future__ import annotations

import numpy as np


def metrics_from_hits(hits: np.ndarray, n_rel: np.ndarray, ks=(1, 10)) -> dict[str, float]:
    """``hits``: queries × k_max relevance of the ranked top documents; ``n_rel``: relevant documents per
    query. Recall@k = |relevant ∩ top-k| / |relevant|; MRR@10 = 1/rank of the first relevant document in
    the top 10 (0 if none); nDCG@10 binary. Queries without a relevant document are left out."""
    valid = n_rel > 0
    hits, n_rel = hits[valid].astype(float), n_rel[valid]
    out = {f"recall_at_{k}": float((hits[:, :k].sum(1) / n_rel).mean()) for k in ks}
    top10 = hits[:, :10]
    first = np.where(top10.any(1), top10.argmax(1) + 1, 0)
    out["mrr_at_10"] = float(np.where(first > 0, 1.0 / np.maximum(first, 1), 0.0).mean())
    disc = 1.0 / np.log2(np.arange(2, 12))
    idcg = np.cumsum(disc)[np.minimum(n_rel, 10) - 1]
    out["ndcg_at_10"] = float(((top10 * disc[: top10.shape[1]]).sum(1) / idcg).mean())
    return out


def retrieval_metrics(scores: np.ndarray, rel: np.ndarray, ks=(1, 10)) -> dict[str, float]:
    """The metrics from a dense ``scores`` / ``rel`` (bool) queries × corpus pair (small inputs, tests)."""
    k_max = max(max(ks), 10)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k_max]
    return metrics_from_hits(np.take_along_axis(rel, top, 1), rel.sum(1), ks)


def top_documents(qe, ce, k: int, chunk: int = 1024) -> np.ndarray:
    """Indices of the k best documents of every query (torch tensors on any device), by decreasing score."""
    import torch

    out = []
    with torch.no_grad():
        for lo in range(0, len(qe), chunk):
            out.append(torch.topk(qe[lo : lo + chunk] @ ce.T, min(k, len(ce)), dim=1).indices.cpu().numpy())
    return np.concatenate(out)


def relevant_counts(fact_test: np.ndarray, fact_corpus: np.ndarray) -> np.ndarray:
    ids, counts = np.unique(fact_corpus, return_counts=True)
    at = np.minimum(np.searchsorted(ids, fact_test), len(ids) - 1)
    return np.where(ids[at] == fact_test, counts[at], 0)


def evaluate_encoder(model, arrays: dict, device, ks=(1, 10)) -> dict[str, float]:
    """Encode the test queries and the corpus with ``model`` and compute the metrics."""
    import torch

    with torch.no_grad():
        qe = model.encode_q(torch.as_tensor(arrays["q_test"], device=device))
        ce = model.encode_d(torch.as_tensor(arrays["corpus"], device=device))
    top = top_documents(qe, ce, max(max(ks), 10))
    hits = arrays["fact_corpus"][top] == arrays["fact_test"][:, None]
    return metrics_from_hits(hits, relevant_counts(arrays["fact_test"], arrays["fact_corpus"]), ks)
