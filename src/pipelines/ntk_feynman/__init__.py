"""Finite-width (1/n) NTK corrections: layer recursions vs sampled networks (the contract: spec.py)."""
