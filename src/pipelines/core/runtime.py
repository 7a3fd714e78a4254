"""Seeding, thread count and device choice: the one place nodes get them from."""
from __future__ import annotations

import random
import sys

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch Generator for explicit sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def set_threads(n: int) -> int:
    """Fix torch's intra-op threads (tiny models on 2 busy cores are often fastest at 1); returns n."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def get_device(prefer: str = "auto") -> torch.device:
    """``cuda`` when a GPU is visible and (inside a Ray task) Ray assigned one to us, else ``cpu``.

    Node code never sets CUDA_VISIBLE_DEVICES: Ray does that for the task it schedules."""
    if prefer == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if prefer == "cuda":
            raise RuntimeError("device 'cuda' was asked for but torch sees no GPU")
        return torch.device("cpu")
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        # inside a Ray task the assignment decides (recent Ray leaves GPUs visible to num_gpus=0 tasks)
        if ray.get_runtime_context().get_task_id() is not None and not ray.get_gpu_ids():
            return torch.device("cpu")
    return torch.device("cuda")


def to_cpu(obj):
    """Recursively move tensors in dicts / lists / tuples to the CPU (node outputs must be CPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
