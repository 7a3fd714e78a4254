"""HypoSpace: Validity, Uniqueness and Recovery of set-valued hypothesis samplers"""
from pipelines.hypospace.pipeline import create_pipeline

__all__ = ["create_pipeline"]
