"""GHOST: structured state pruning of a Mamba2-style SSM by forward-only controllability x observability scores"""
from pipelines.ghost.pipeline import create_pipeline

__all__ = ["create_pipeline"]
