"""Named random streams: one independent, reproducible generator per (seed, purpose), instead of
``seed + 1000``-style offsets (which collide when seed grids overlap and say nothing about their use).

    g = rng(seed, "init")          # torch.Generator
    r = np_rng(seed, "noise")      # numpy.random.Generator
"""

from __future__ import annotations

import hashlib


def stream_seed(seed: int, name: str) -> int:
    """A 63-bit seed derived from ``(seed, name)`` by SHA-256: stable across runs, machines and Python
    versions (unlike ``hash``), and distinct for distinct names."""
    if not name:
        raise ValueError("a random stream needs a name (what it is for: 'init', 'noise', 'batches', ...)")
    digest = hashlib.sha256(f"{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def rng(seed: int, name: str):
    """``torch.Generator`` of the stream ``name`` of ``seed``."""
    import torch

    return torch.Generator().manual_seed(stream_seed(seed, name))


def np_rng(seed: int, name: str):
    """``numpy.random.Generator`` of the stream ``name`` of ``seed``."""
    import numpy as np

    return np.random.default_rng(stream_seed(seed, name))


__all__ = ["np_rng", "rng", "stream_seed"]
