"""Soft differentiable relaxations of hard PyTorch primitives (SoftTorch; the contract: spec.py)."""
