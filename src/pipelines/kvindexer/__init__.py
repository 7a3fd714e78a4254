"""Learned KV-cache indexer with latent memory for bounded-KV long-context inference (IndexMem)"""
from pipelines.kvindexer.pipeline import create_pipeline

__all__ = ["create_pipeline"]
