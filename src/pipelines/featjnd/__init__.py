"""FeatJND: task-aligned just-noticeable-difference maps for deep features at a split point"""
from pipelines.featjnd.pipeline import create_pipeline

__all__ = ["create_pipeline"]
