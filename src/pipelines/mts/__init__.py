"""Meta-learned training-data selection over real + synthetic data: meta-gradient GSNR vs batch size and informative features"""
from pipelines.mts.pipeline import create_pipeline

__all__ = ["create_pipeline"]
