"""WBMM: windowed batch matrix multiplication vs large-kernel depthwise convolution (operator benchmark + small accuracy check)"""
from pipelines.wbmm.pipeline import create_pipeline

__all__ = ["create_pipeline"]
