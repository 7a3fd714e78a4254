"""WeDLM: diffusion decoding on causal attention with streaming commits"""
from pipelines.wedlm.pipeline import create_pipeline

__all__ = ["create_pipeline"]
