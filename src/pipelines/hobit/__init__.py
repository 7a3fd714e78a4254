"""HOBIT: hard yet non-contradictory in-batch negatives for InfoNCE (the contract: spec.py)."""
