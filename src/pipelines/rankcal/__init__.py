"""Calibration for probabilistic label ranking: full, sub-ranking and top-k calibration (the contract: spec.py)."""
