"""RECM: recurrent equivariant constraint modulation (per-layer learned relaxation; the contract: spec.py)."""
