"""HOBIT: hard yet non-contradictory in-batch negatives for InfoNCE"""
from pipelines.hobit.pipeline import create_pipeline

__all__ = ["create_pipeline"]
