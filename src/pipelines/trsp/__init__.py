"""Fair transit stop placement: JR/core, ECA, GC-TrSP, lambda-hybrid"""
from pipelines.trsp.pipeline import create_pipeline

__all__ = ["create_pipeline"]
