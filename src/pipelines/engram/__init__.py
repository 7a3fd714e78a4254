"""AI Engram: closed-form memory traces W·Σ_S·Σ_R⁺ — erase and compose memories by linear arithmetic"""
from pipelines.engram.pipeline import create_pipeline

__all__ = ["create_pipeline"]
