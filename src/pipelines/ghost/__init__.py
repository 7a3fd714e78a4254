"""GHOST: structured state pruning of a Mamba2-style SSM by forward-only controllability x observability scores (the contract: spec.py)."""
