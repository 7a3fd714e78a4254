"""MedTPE: lossless medical token-pair merges with embedding-only tuning"""
from pipelines.medtpe.pipeline import create_pipeline

__all__ = ["create_pipeline"]
