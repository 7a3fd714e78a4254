"""LoSA: locality-aware sparse attention for block-wise diffusion LMs"""
from pipelines.losa.pipeline import create_pipeline

__all__ = ["create_pipeline"]
