"""Soft differentiable relaxations of hard PyTorch primitives (SoftTorch)"""
from pipelines.softtorch.pipeline import create_pipeline

__all__ = ["create_pipeline"]
