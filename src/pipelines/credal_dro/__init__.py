"""Bulk-calibrated credal ambiguity sets: mean+sup robust objective as LP/SOCP"""
from pipelines.credal_dro.pipeline import create_pipeline

__all__ = ["create_pipeline"]
