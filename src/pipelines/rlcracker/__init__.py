"""RLCracker: detector-free RL paraphrase attack that removes Unigram/KGW watermarks"""
from pipelines.rlcracker.pipeline import create_pipeline

__all__ = ["create_pipeline"]
