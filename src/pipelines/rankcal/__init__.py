"""Calibration for probabilistic label ranking: full, sub-ranking and top-k calibration"""
from pipelines.rankcal.pipeline import create_pipeline

__all__ = ["create_pipeline"]
