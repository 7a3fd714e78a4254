"""LoSA: locality-aware sparse attention for block-wise diffusion LMs (the contract: spec.py)."""
