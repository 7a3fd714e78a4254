"""RECM: recurrent equivariant constraint modulation (per-layer learned relaxation)"""
from pipelines.recm.pipeline import create_pipeline

__all__ = ["create_pipeline"]
