"""LLDS: gated likelihood-preserving regulariser against lazy likelihood displacement in GRPO"""
from pipelines.llds.pipeline import create_pipeline

__all__ = ["create_pipeline"]
