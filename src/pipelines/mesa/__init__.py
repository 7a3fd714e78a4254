"""MoE safety alignment by optimal-transport expert capacity reallocation and routing refinement"""
from pipelines.mesa.pipeline import create_pipeline

__all__ = ["create_pipeline"]
