"""TESS: text → four temporal primitives → confidence-gated prefix tokens for a PatchTST forecaster (the contract: spec.py)."""
