"""The dual encoder (two MLP towers, L2-normalised outputs) and the InfoNCE loss with in-batch negatives
(plus, for the mining variants, one mined negative per query shared by the batch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DualEncoder(nn.Module):
    def __init__(self, in_q: int, in_d: int, hidden: int, out: int) -> None:
        super().__init__()
        self.q = nn.Sequential(nn.Linear(in_q, hidden), nn.ReLU(), nn.Linear(hidden, out))
        self.d = nn.Sequential(nn.Linear(in_d, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def encode_q(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.q(x), dim=-1)

    def encode_d(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.d(x), dim=-1)


def infonce(
    model: DualEncoder,
    tau: float,
    q: torch.Tensor,
    d: torch.Tensor,
    neg: torch.Tensor | None = None,
    neg_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of q_i against its d_i among the batch's documents (and the mined ones, ``neg``;
    ``neg_mask[i, k]`` hides mined doc k from query i when it is i's own positive document).
    Also returns the in-batch hardness: mean over queries of (top negative cosine − positive cosine)."""
    zq, zd = model.encode_q(q), model.encode_d(d)
    docs = zd if neg is None else torch.cat([zd, model.encode_d(neg)])
    cos = zq @ docs.T
    b = len(q)
    hide = torch.zeros(cos.shape, dtype=torch.bool, device=cos.device)
    target = torch.arange(b, device=cos.device)
    if neg_mask is not None:
        hide[:, b:] = neg_mask
    loss = F.cross_entropy((cos / tau).masked_fill(hide, -torch.inf), target)
    with torch.no_grad():
        pos = cos.diagonal()
        hide = hide.clone()
        hide[target, target] = True
        hardness = (cos.masked_fill(hide, -torch.inf).max(1).values - pos).mean()
    return loss, {"hardness": hardness}
