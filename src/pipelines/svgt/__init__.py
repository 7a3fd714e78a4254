"""Stable value guidance: an independent value module steers a frozen LM through learnable bridge tokens"""
from pipelines.svgt.pipeline import create_pipeline

__all__ = ["create_pipeline"]
