"""PRISM: gauge-invariant tangent-space DP for LoRA"""
from pipelines.prism.pipeline import create_pipeline

__all__ = ["create_pipeline"]
