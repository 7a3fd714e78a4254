"""BiMU: metaplastic Bayesian binary NN with bounded-memory updates for online continual and active learning"""
from pipelines.bimu.pipeline import create_pipeline

__all__ = ["create_pipeline"]
