"""Finite-width (1/n) NTK corrections: layer recursions vs sampled networks"""
from pipelines.ntk_feynman.pipeline import create_pipeline

__all__ = ["create_pipeline"]
